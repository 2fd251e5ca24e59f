"""Schedules as data: generators, the validating simulation, the grid and its command."""

import subprocess
import sys

import pytest

from lingpipe.pipeline import schedule, simulate
from lingpipe.pipeline.schedule import Action, ScheduleError

ALL = [
    (name, k, m, v)
    for name in schedule.SCHEDULES
    for k in (1, 2, 3, 4)
    for m in (1, 2, 4, 8)
    for v in ((1, 2) if name == "interleaved_1f1b" else (1,))
    if not (v > 1 and m % k)
]


def Kinds(acts):
    return "".join(a.kind for a in acts)


@pytest.mark.parametrize("name,k,m,v", ALL)
def test_every_schedule_runs_each_action_once_on_its_device(name, k, m, v):
    sched = schedule.Make(name, k, m, v)
    sim = simulate.Simulate(sched)  # raises on a broken dependency or deadlock
    assert sched.num_stages == k * v
    assert len(sim.order) == sum(len(a) for a in sched.device_actions)
    for d, acts in enumerate(sched.device_actions):
        assert all(sched.DeviceOf(a.stage) == d for a in acts)


def test_gpipe_runs_every_forward_then_the_backwards_last_micro_batch_first():
    sched = schedule.Make("gpipe", 2, 3)
    assert sched.device_actions[1] == (
        Action("F", 1, 0),
        Action("F", 1, 1),
        Action("F", 1, 2),
        Action("B", 1, 2),
        Action("B", 1, 1),
        Action("B", 1, 0),
    )
    assert simulate.Simulate(sched).peak_alive == [3, 3]


def test_1f1b_warms_up_then_alternates_and_holds_at_most_k_minus_stage():
    sched = schedule.Make("1f1b", 4, 8)
    assert Kinds(sched.device_actions[0]) == "FFF" + "FB" * 5 + "BBB"
    assert Kinds(sched.device_actions[3]) == "FB" * 8
    sim = simulate.Simulate(sched)
    assert sim.peak_alive == [4, 3, 2, 1]
    gpipe = simulate.Simulate(schedule.Make("gpipe", 4, 8))
    assert gpipe.peak_alive == [8, 8, 8, 8]
    assert sim.makespan == gpipe.makespan  # the same bubble, less memory


def test_zero_bubble_splits_backwards_and_shrinks_the_bubble_at_1f1b_memory():
    sched = schedule.Make("zero_bubble", 4, 8)
    assert sched.splits_backward
    sim, one_f = simulate.Simulate(sched), simulate.Simulate(schedule.Make("1f1b", 4, 8))
    assert sim.makespan < one_f.makespan
    assert sim.bubble < one_f.bubble
    assert sim.peak_alive == one_f.peak_alive == [4, 3, 2, 1]
    # Weight gradients fill the first device's cool-down, where 1F1B idles.
    kinds = Kinds(sched.device_actions[0])
    assert kinds.count("I") == kinds.count("W") == 8


def test_interleaved_puts_chunk_c_on_device_c_mod_k_and_shrinks_the_bubble():
    sched = schedule.Make("interleaved_1f1b", 4, 8, num_virtual_stages=2)
    assert {a.stage for a in sched.device_actions[1]} == {1, 5}
    assert sched.device_actions[0][:5] == tuple(
        Action("F", s, m) for s, m in [(0, 0), (0, 1), (0, 2), (0, 3), (4, 0)]
    )
    sim = simulate.Simulate(sched)
    one_f = simulate.Simulate(schedule.Make("1f1b", 4, 8))
    assert sim.bubble < one_f.bubble
    # Each chunk is half a stage: the step takes fewer stage-times than 1F1B's.
    assert sim.makespan / 2 < one_f.makespan


def test_unknown_schedule_suggests_the_closest():
    with pytest.raises(ScheduleError, match=r"unknown schedule '1fb1'.*did you mean '1f1b'"):
        schedule.Make("1fb1", 2, 4)


def test_interleaved_refuses_micro_batches_not_a_multiple_of_the_stages():
    with pytest.raises(
        ScheduleError, match=r"num_micro_batches=6 must be a multiple of num_stages=4"
    ):
        schedule.Make("interleaved_1f1b", 4, 6, num_virtual_stages=2)


def test_virtual_stages_need_the_interleaved_schedule():
    with pytest.raises(
        ScheduleError, match=r"num_virtual_stages=2 needs schedule='interleaved_1f1b'"
    ):
        schedule.Make("1f1b", 2, 4, num_virtual_stages=2)


def test_a_deadlock_names_the_first_action_that_cannot_run_and_shows_the_grid():
    good = schedule.Make("1f1b", 2, 2)
    # Device 0 wants the backward of micro-batch 0 before it sends micro-batch 0 on.
    bad = schedule.Schedule(
        "mine",
        2,
        2,
        2,
        (
            (Action("B", 0, 0), Action("F", 0, 0), Action("F", 0, 1), Action("B", 0, 1)),
            good.device_actions[1],
        ),
    )
    with pytest.raises(ScheduleError) as e:
        simulate.Simulate(bad)
    message = str(e.value)
    assert (
        "schedule 'mine' deadlocks: device 0's next action B s0 mb0 waits for F s0 mb0" in message
    )
    assert "dev 0" in message and "dev 1" in message


def test_a_missing_or_misplaced_action_is_named():
    good = schedule.Make("gpipe", 2, 2)
    missing = schedule.Schedule("m", 2, 2, 2, (good.device_actions[0][:-1], good.device_actions[1]))
    with pytest.raises(ScheduleError, match=r"stage 0 micro-batch 0 needs one F and one B"):
        simulate.Simulate(missing)
    moved = schedule.Schedule("m", 2, 2, 2, (good.device_actions[1], good.device_actions[0]))
    with pytest.raises(ScheduleError, match=r"F s1 mb0 is listed on device 0, but stage 1 lives"):
        simulate.Simulate(moved)


def test_costs_change_the_makespan_and_bubble():
    sched = schedule.Make("1f1b", 2, 4)
    unit = simulate.Simulate(sched)
    assert unit.makespan == 4 * 3 + 3  # (F + B) per micro-batch, plus the fill
    heavy = simulate.Simulate(sched, costs={"B": 4.0})
    assert heavy.makespan > unit.makespan


def test_bubble_fraction_formula():
    assert schedule.BubbleFraction(1, 8) == 0.0
    assert schedule.BubbleFraction(4, 1) == 0.75
    sim = simulate.Simulate(schedule.Make("gpipe", 4, 8))
    assert sim.bubble == pytest.approx(schedule.BubbleFraction(4, 8))


def test_command_prints_the_grid_and_figures():
    run = subprocess.run(
        [sys.executable, "-m", "lingpipe.pipeline.schedule", "--schedule=1f1b",
         "--num_stages=4", "--num_micro_batches=8"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[1].split()[:6] == ["dev", "0", "F0", "F1", "F2", "F3"]
    assert "peak alive micro-batches s0: 4" in run.stdout
    assert "bubble 27.3%" in run.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "lingpipe.pipeline.schedule", "--schedule=pipedream"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2
    assert "unknown schedule 'pipedream'" in bad.stdout
