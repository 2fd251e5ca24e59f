"""Schedules as data: generators, the validating simulation, the grid and its command."""

import pytest
from schedule_cases import ALL, Command

from lingpipe.pipeline.schedules import controllable_memory, generators, schedule, simulate
from lingpipe.pipeline.schedules.schedule import Action, ScheduleError


def Kinds(acts):
    return "".join(a.kind for a in acts)


@pytest.mark.parametrize("name,k,m,v", ALL)
def test_every_schedule_runs_each_action_once_on_its_device(name, k, m, v):
    sched = generators.Make(name, k, m, v)
    sim = simulate.Simulate(sched)  # raises on a broken dependency or deadlock
    assert sched.num_stages == k * (2 if name in generators.V_SHAPED else v)
    assert len(sim.order) == sum(len(a) for a in sched.device_actions)
    for d, acts in enumerate(sched.device_actions):
        assert all(sched.DeviceOf(a.stage) == d for a in acts)


def test_gpipe_runs_every_forward_then_the_backwards_last_micro_batch_first():
    sched = generators.Make("gpipe", 2, 3)
    assert sched.device_actions[1] == tuple(map(Action, "FFFBBB", [1] * 6, [0, 1, 2, 2, 1, 0]))
    assert simulate.Simulate(sched).peak_alive == [3, 3]


def test_1f1b_warms_up_then_alternates_and_holds_at_most_k_minus_stage():
    sched = generators.Make("1f1b", 4, 8)
    assert Kinds(sched.device_actions[0]) == "FFF" + "FB" * 5 + "BBB"
    assert Kinds(sched.device_actions[3]) == "FB" * 8
    sim = simulate.Simulate(sched)
    assert sim.peak_alive == [4, 3, 2, 1]
    gpipe = simulate.Simulate(generators.Make("gpipe", 4, 8))
    assert gpipe.peak_alive == [8, 8, 8, 8]
    assert sim.makespan == gpipe.makespan  # the same bubble, less memory


@pytest.mark.parametrize("k,m", [(4, 8), (8, 32), (2, 4), (3, 5)])
def test_zero_bubble_is_zb_h1_its_bubble_a_third_of_1f1bs_at_1f1bs_first_device_memory(k, m):
    sched = generators.Make("zero_bubble", k, m)
    assert sched.splits_backward
    sim, one_f = simulate.Simulate(sched), simulate.Simulate(generators.Make("1f1b", k, m))
    # ZB-H1's bubble under F = I = W = 1 (B = 2): (K-1) / (3M + K-1), a third of 1F1B's.
    assert sim.bubble == pytest.approx((k - 1) / (3 * m + k - 1))
    assert sim.makespan == 3 * m + k - 1 < one_f.makespan
    assert max(sim.device_peak_alive) == k == one_f.peak_alive[0]
    kinds = Kinds(sched.device_actions[0])
    assert kinds.count("I") == kinds.count("W") == m and "B" not in kinds


def test_zero_bubble_figures_at_k4_m8():
    sim = simulate.Simulate(generators.Make("zero_bubble", 4, 8))
    assert f"{sim.bubble:.1%}" == "11.1%"


def test_interleaved_puts_chunk_c_on_device_c_mod_k_and_shrinks_the_bubble():
    sched = generators.Make("interleaved_1f1b", 4, 8, num_virtual_stages=2)
    assert {a.stage for a in sched.device_actions[1]} == {1, 5}
    assert sched.device_actions[0][:5] == tuple(
        Action("F", s, m) for s, m in [(0, 0), (0, 1), (0, 2), (0, 3), (4, 0)]
    )
    sim = simulate.Simulate(sched)
    one_f = simulate.Simulate(generators.Make("1f1b", 4, 8))
    assert sim.bubble < one_f.bubble
    # Each chunk is half a stage: the step takes fewer stage-times than 1F1B's.
    assert sim.makespan / 2 < one_f.makespan


def test_unknown_schedule_suggests_the_closest():
    with pytest.raises(ScheduleError, match=r"unknown schedule '1fb1'.*did you mean '1f1b'"):
        generators.Make("1fb1", 2, 4)


def test_interleaved_runs_any_m_in_rounds_of_k_or_more():
    for m in (5, 6, 7, 9, 10, 11):  # not multiples of K: M // K rounds of K or more
        one_f = simulate.Simulate(generators.Make("1f1b", 4, m))
        for name in ("interleaved_1f1b", "interleaved_zero_bubble"):
            sched = generators.Make(name, 4, m, num_virtual_stages=2)
            assert simulate.Simulate(sched).bubble < one_f.bubble, (name, m)
    # K=4, M=6: one round of 6, chunk 0 for all of it, then chunk 1.
    sched = generators.Make("interleaved_1f1b", 4, 6, num_virtual_stages=2)
    forwards = [a.stage for a in sched.device_actions[0] if a.kind == "F"]
    assert forwards == [0] * 6 + [4] * 6
    assert f"{simulate.Simulate(sched).bubble:.1%}" == "20.0%"


def test_virtual_stages_need_a_schedule_that_runs_several_per_device():
    with pytest.raises(
        ScheduleError, match=r"'1f1b': num_virtual_stages=2 needs one of interleaved_1f1b, "
    ):
        generators.Make("1f1b", 2, 4, num_virtual_stages=2)
    with pytest.raises(
        ScheduleError, match=r"'zbv': num_virtual_stages=3 .* two stages per device"
    ):
        generators.Make("zbv", 2, 4, num_virtual_stages=3)


def test_a_deadlock_is_one_line_naming_each_blocked_action_and_what_it_waits_for():
    good = generators.Make("1f1b", 2, 2)
    # Device 0 wants the backward of micro-batch 0 before it sends micro-batch 0 on.
    first = tuple(map(Action, "BFFB", [0] * 4, [0, 0, 1, 1]))
    bad = schedule.Schedule("mine", 2, 2, 2, (first, good.device_actions[1]))
    with pytest.raises(ScheduleError) as e:
        simulate.Simulate(bad)
    assert str(e.value) == (
        "schedule 'mine' deadlocks after 0 of 8 actions: device 0's next action B s0 mb0 "
        "waits for F s0 mb0 (listed after it), B s1 mb0 (listed later on device 1); device "
        "1's next action F s1 mb0 waits for F s0 mb0 (listed later on device 0); expected "
        "each action after those it waits for"
    )


def test_a_missing_or_misplaced_action_is_named():
    good = generators.Make("gpipe", 2, 2)
    # A missing backward is refused though the schedule is not forward-only.
    missing = schedule.Schedule("m", 2, 2, 2, (good.device_actions[0][:-1], good.device_actions[1]))
    with pytest.raises(ScheduleError, match=r"stage 0 micro-batch 0 needs one F and one B"):
        simulate.Simulate(missing)
    moved = schedule.Schedule("m", 2, 2, 2, (good.device_actions[1], good.device_actions[0]))
    with pytest.raises(ScheduleError, match=r"F s1 mb0 is listed on device 0, but stage 1 lives"):
        simulate.Simulate(moved)


def test_costs_change_the_makespan_and_bubble():
    sched = generators.Make("1f1b", 2, 4)
    unit = simulate.Simulate(sched)
    assert unit.makespan == 4 * 3 + 3  # (F + B) per micro-batch, plus the fill
    heavy = simulate.Simulate(sched, costs={"B": 4.0})
    assert heavy.makespan > unit.makespan


def test_gpipe_bubble_is_the_papers_formula():
    for k, m in ((1, 8), (4, 1), (4, 8)):
        assert Bubble("gpipe", k, m) == pytest.approx((k - 1) / (m + k - 1))  # GPipe paper


def test_breadth_first_over_any_placement():
    v = generators.BreadthFirst("gpipe", 2, 2, placement=generators.VPlacement(2))
    assert Kinds(v.device_actions[0]) == "FFFFBBBB"
    assert [a.stage for a in v.device_actions[0]] == [0, 0, 3, 3, 3, 3, 0, 0]
    simulate.Simulate(v)


def test_command_prints_the_grid_and_figures():
    run = Command("--schedule=1f1b", "--num_stages=4", "--num_micro_batches=8")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[1].split()[:6] == ["dev", "0", "F0", "F1", "F2", "F3"]
    assert "device 0: idle 27.3%; peak alive micro-batches 4 (s0: 4)" in run.stdout
    assert "bubble 27.3%" in run.stdout
    bad = Command("--schedule=pipedream")
    assert bad.returncode == 2 and not bad.stdout
    assert "unknown schedule 'pipedream'" in bad.stderr
    # argparse's own errors too: one line, not its usage block.
    bad = Command("--num_micro_batches=eight")
    assert bad.returncode == 2 and not bad.stdout
    assert bad.stderr == (
        "lingpipe.pipeline.schedules: error: argument --num_micro_batches: invalid int "
        "value: 'eight'\n"
    )


def Bubble(name, k=4, m=8, v=1):
    return simulate.Simulate(generators.Make(name, k, m, v)).bubble


def test_zbv_runs_two_stages_per_device_in_a_v_at_or_below_torchs_bubble():
    sched = generators.Make("zbv", 4, 8)
    assert sched.num_stages == 8 and sched.stage_devices == (0, 1, 2, 3, 3, 2, 1, 0)
    assert sched.splits_backward
    assert {a.stage for a in sched.device_actions[0]} == {0, 7}
    sim = simulate.Simulate(sched)
    # torch.distributed.pipelining's simulator gives its ZBV order 5.9% here.
    assert round(100 * sim.bubble, 1) <= 5.9
    assert sim.bubble < Bubble("zero_bubble") < Bubble("1f1b")
    # Two half-size stages per device: 2K stage-micro-batches are 1F1B's first device's K.
    assert max(sim.device_peak_alive) <= 2 * 4


def test_looped_bfs_runs_every_micro_batch_through_chunk_0_before_chunk_1():
    sched = generators.Make("looped_bfs", 2, 4, 2)
    assert sched.stage_devices == (0, 1, 0, 1)
    assert Kinds(sched.device_actions[0]) == "F" * 8 + "B" * 8
    assert [a.stage for a in sched.device_actions[0][:8]] == [0] * 4 + [2] * 4
    sim = simulate.Simulate(sched)
    assert sim.peak_alive == [4, 4, 4, 4]  # GPipe's memory
    assert Bubble("looped_bfs", 4, 8, 2) < Bubble("gpipe", 4, 8)


def test_interleaved_zero_bubble_splits_backwards_over_chunks():
    sched = generators.Make("interleaved_zero_bubble", 4, 8, 2)
    assert sched.splits_backward and sched.stage_devices == (0, 1, 2, 3) * 2
    sim = simulate.Simulate(sched)
    assert sim.bubble < Bubble("interleaved_1f1b", 4, 8, 2) and sim.bubble < Bubble("zero_bubble")
    assert f"{sim.bubble:.1%}" == "5.9%"
    assert max(sim.device_peak_alive) <= 2 * 4


def test_dualpipev_order_on_the_v_placement():
    sched = generators.Make("dualpipev", 4, 8)
    assert sched.stage_devices == generators.VPlacement(4)
    kinds = {a.kind for acts in sched.device_actions for a in acts}
    assert kinds == {"F", "B", "I", "W"}  # whole backwards in the main phase, split at the end
    # The last device starts with its two stages' forwards in turn (its warm-up pairs).
    assert sched.device_actions[3][:4] == (
        Action("F", 3, 0), Action("F", 4, 0), Action("F", 3, 1), Action("F", 4, 1),
    )  # fmt: skip
    sim = simulate.Simulate(sched)
    assert round(100 * sim.bubble, 1) <= 5.9
    with pytest.raises(ScheduleError, match=r"expected num_micro_batches >= 2 \* num_stages = 8"):
        generators.Make("dualpipev", 4, 6)


@pytest.mark.parametrize("k,m,v", [(1, 1, 1), (3, 4, 1), (2, 4, 2), (4, 6, 2)])
def test_forward_only_runs_each_forward_once_in_micro_batch_order(k, m, v):
    sched = generators.Make("forward_only", k, m, v)
    assert not sched.has_backward and sched.num_stages == k * v
    for d, acts in enumerate(sched.device_actions):
        assert Kinds(acts) == "F" * (m * v)
        for stage in sched.StagesOf(d):
            assert [a.micro_batch for a in acts if a.stage == stage] == list(range(m))
    sim = simulate.Simulate(sched)  # accepted without backwards
    assert sim.peak_alive == [1] * (k * v)
    assert sim.makespan == m * v + k - 1  # every device busy once its first input arrives


def test_command_prints_every_new_schedules_figures():
    figures = (("zero_bubble", "11.1%"), ("zbv", "5.9%"), ("dualpipev", "5.9%"))
    figures += (("v_half", "9.4%"), ("v_min", "18.6%"))
    for name, bubble in figures:
        run = Command(f"--schedule={name}", "--num_stages=4", "--num_micro_batches=8")
        assert run.returncode == 0, run.stderr
        assert f"bubble {bubble}" in run.stdout
        if name == "v_half":  # the grid: device 0 starts with two forwards of its first stage
            assert run.stdout.splitlines()[1].split()[:4] == ["dev", "0", "F0.0", "F1.0"]
            assert "device 0: idle 9.4%; peak alive micro-batches 6 (s0: 5, s7: 1)" in run.stdout


# V-Half and V-Min against 1F1B and ZBV under unit costs (F = I = W = 1, B = 2): per device
# the peak of (stage, micro-batch) pairs alive (simulate's device_peak_alive), and the
# bubble. A stage of the V is half a 1F1B stage, so its pairs count half a 1F1B micro-batch's
# activations: 1F1B's first device holds K whole ones, ZBV 2K halves (the same memory),
# V-Half 2 (K // 2 + 1) halves and V-Min 2 ((K + 1) // 3 + 1), about a half and a third of
# 1F1B's as K grows (3 and 2 of 4 at K = 4; 5 and 4 of 8 at K = 8).
V_FIGURES = {
    (4, 8): {
        "1f1b": ([4, 3, 2, 1], "27.3%"),
        "zbv": ([8] * 4, "5.9%"),
        "v_half": ([6] * 4, "9.4%"),
        "v_min": ([4] * 4, "18.6%"),
    },
    (8, 16): {
        "1f1b": ([8, 7, 6, 5, 4, 3, 2, 1], "30.4%"),
        "zbv": ([16] * 8, "6.8%"),
        "v_half": ([10] * 8, "15.0%"),
        "v_min": ([7] + [8] * 7, "22.0%"),
    },
}


def WholeStages(name, k):
    """The peak activations V-Half and V-Min hold, in 1F1B stages' micro-batches."""
    return k // 2 + 1 if name == "v_half" else (k + 1) // 3 + 1


@pytest.mark.parametrize("k,m", sorted(V_FIGURES))
def test_v_half_and_v_min_hold_about_a_half_and_a_third_of_1f1bs_activations(k, m):
    sims = {name: simulate.Simulate(generators.Make(name, k, m)) for name in V_FIGURES[k, m]}
    for name, (peaks, bubble) in V_FIGURES[k, m].items():
        assert (sims[name].device_peak_alive, f"{sims[name].bubble:.1%}") == (peaks, bubble), name
    assert max(sims["1f1b"].peak_alive) == k and max(sims["zbv"].device_peak_alive) == 2 * k
    for name in ("v_half", "v_min"):
        sched = generators.Make(name, k, m)
        assert sched.stage_devices == generators.VPlacement(k) and sched.splits_backward
        assert max(sims[name].device_peak_alive) == 2 * WholeStages(name, k)
        # The peak is the order's, not the costs': a forward starts after what is listed
        # before it has ended, whatever each action costs.
        heavy = simulate.Simulate(sched, costs={"F": 2.0, "W": 3.0})
        assert heavy.device_peak_alive == sims[name].device_peak_alive
    bubbles = [sims[name].bubble for name in ("zbv", "v_half", "v_min", "1f1b")]
    assert bubbles == sorted(bubbles) and len(set(bubbles)) == 4


@pytest.mark.parametrize("name", ["v_half", "v_min"])
def test_v_half_and_v_min_peaks_follow_their_building_block_for_every_k(name):
    for k in range(1, 9):
        for m in (1, k, 2 * k, 3 * k):
            peak = max(simulate.Simulate(generators.Make(name, k, m)).device_peak_alive)
            assert peak <= 2 * WholeStages(name, k), (k, m)
            assert m < 2 * k or peak == 2 * WholeStages(name, k), (k, m)  # reached when steady


@pytest.mark.parametrize("name", ["v_half", "v_min"])
def test_v_half_and_v_min_repeat_their_block_every_six_actions_in_the_steady_state(name):
    k, m = 4, 16
    sched = generators.Make(name, k, m)
    for acts in sched.device_actions:
        # Each action is the one six before it, a micro-batch later, for most of the list.
        repeats = [
            acts[i] == acts[i - 6]._replace(micro_batch=acts[i - 6].micro_batch + 1)
            for i in range(6, len(acts))
        ]
        assert sum(repeats) >= 6 * (m - 2 * k)
        assert any(all(repeats[i : i + 6 * 4]) for i in range(len(repeats)))


def test_controllable_memory_names_the_schedules_it_builds():
    assert controllable_memory.ControllableMemory("v_min", 2, 4) == generators.Make("v_min", 2, 4)
    with pytest.raises(ScheduleError, match=r"expected one of v_half, v_min, received 'zbv'"):
        controllable_memory.ControllableMemory("zbv", 2, 4)
