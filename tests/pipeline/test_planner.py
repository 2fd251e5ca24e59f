"""The planner's search over fixed costs: deterministic, never over the cap, refusals
that name their device and excess, and K=1 when pipelining is predicted to lose."""

import dataclasses

import pytest

from lingpipe.pipeline.planning import planner

# Eight equal cells of 1 GFLOP per example, 1 MiB out, 4 MiB of weights each.
COSTS = planner.ModelCosts(flops=(1e9,) * 8, out_bytes=(2**20,) * 8, weight_bytes=(2**22,) * 8)
FAST_LINKS = planner.Rates(flops_per_s=1e12, action_s=1e-5, bytes_per_s=1e11, latency_s=1e-6)


def _Memory(c):
    """Weights of the device's cells, plus 1 MiB per example of a micro-batch per stage."""
    per_device = [0] * c.num_stages
    chunks = len(c.partition)
    micro = 32 // c.replicas // c.num_micro_batches
    for s, cells in enumerate(c.partition):
        d = s % c.num_stages if chunks == c.num_stages else min(s, chunks - 1 - s)
        per_device[d] += cells * 2**22 + micro * 2**20 * (1 if c.remat == "always" else 4)
    return per_device


def _Search(cap, rates=FAST_LINKS, devices=4):
    return planner.Search(COSTS, rates, devices, cap, 32, _Memory)


def test_the_search_is_deterministic_and_never_over_the_cap():
    first, second = _Search(48 * 2**20), _Search(48 * 2**20)
    assert first.chosen.Describe() == second.chosen.Describe()
    assert [c.Describe() for c in first.runners_up] == [c.Describe() for c in second.runners_up]
    for c in [first.chosen, *first.runners_up]:
        assert max(c.peak_bytes) <= 48 * 2**20, c.Describe()
    assert first.refused, "a cap of 48 MiB refuses some candidates"
    for r in first.refused:
        assert r.candidate.peak_bytes[r.device] == max(r.candidate.peak_bytes)
        assert r.excess_bytes == max(r.candidate.peak_bytes) - 48 * 2**20 > 0


def test_a_small_cap_forces_stages_and_a_large_one_allows_replicas():
    tight = _Search(20 * 2**20).chosen
    assert tight.num_stages > 1 and max(tight.peak_bytes) <= 20 * 2**20
    roomy = _Search(2**30).chosen
    assert roomy.replicas * roomy.num_stages == 4


def test_when_pipelining_loses_k_1_is_chosen():
    # Transfers between stages cost a second each: no pipeline is predicted fastest.
    slow_links = planner.Rates(flops_per_s=1e12, action_s=1e-5, bytes_per_s=1e3, latency_s=1.0)
    chosen = _Search(2**30, slow_links, devices=1).chosen
    assert chosen.num_stages == 1
    result = planner.Search(
        COSTS, slow_links, 2, 2**30, 32, _Memory, planner.Candidates(2, 8, 32, stages=(1, 2))
    )
    assert result.chosen.num_stages == 1 and result.chosen.replicas == 2


def test_the_flags_are_the_trainers():
    from lingpipe.pipeline.step import settings
    from lingpipe.runners import plan_flags

    c = planner.Candidate(1, 2, 4, "interleaved_1f1b", 2, "never", (2, 2, 2, 2), "flops")
    flags = c.Flags()
    # Every setting the candidate fixes, under the trainer's flag names; the partition
    # as counts per stage: what --plan=FILE reads, each value one its setting takes.
    assert flags == {
        "num_stages": c.num_stages,
        "num_micro_batches": c.num_micro_batches,
        "schedule": c.schedule,
        "num_virtual_stages": c.num_virtual_stages,
        "remat": c.remat,
        "partition": list(c.partition),
    }
    for name, value in flags.items():
        assert settings.Problem(name, value) is None, (name, value)
    replicated = dataclasses.replace(c, replicas=2, remat=("always", "never"))
    flags = replicated.Flags()
    assert flags["strategy"] == "mirrored" and flags["logical_devices"] == 2 * c.num_stages
    assert flags["remat"] == ["always", "never"]
    assert set(flags) <= set(plan_flags.PLAN_FLAGS)


# Two cells of 1 s forward, 1 s inputs' gradient, 1 s weights' gradient (fixed, for any
# micro-batch), 100 weight bytes each; one per stage.
from lingpipe.pipeline.planning import calibrate, cost_model, device_rates  # noqa: E402
from lingpipe.pipeline.schedules import generators, simulate  # noqa: E402

ONE_SECOND = cost_model.CellTimes(((1.0, 0.0),) * 2, ((1.0, 0.0),) * 2, ((1.0, 0.0),) * 2)
# Every stage computes both gradients in these hand computations, as where layers with
# weights before the pipeline read its inputs' gradient (input_gradient); without them
# the first stage leaves its first cell's I out (test_the_first_stage_...).
TWO_CELLS = planner.ModelCosts(
    (1.0, 1.0), (1000, 1000), (100, 100), ONE_SECOND, input_gradient=True
)


def _Predict(schedule, remat, rates, m=2):
    c = planner.Candidate(1, 2, m, schedule, 1, remat, (1, 1))
    return planner.PredictSeconds(c, TWO_CELLS, rates, global_batch=4)


# 1F1B, K=2, M=2, a fixed cost of 0.5 s per action: F = 1.5, B = 2.5 (+1 replayed).
#   dev 1: F0 [1.5, 3]  B0 [3, 5.5]  F1 [5.5, 7]  B1 [7, 9.5]
#   dev 0: F0 [0, 1.5]  F1 [1.5, 3]  B0 [5.5, 8]  B1 [9.5, 12]       -> 12 s
# 'always' replays every forward (B = 3.5): dev 1 B1 ends 11.5, dev 0 B1 at 15.
# 'except_last' keeps stage 1's micro-batch 1 and stage 0's micro-batch 0 (remat.Kept):
#   dev 1: B0 [3, 6.5] F1 [6.5, 8] B1 [8, 10.5]; dev 0: B0 [6.5, 9] B1 [10.5, 14].
# The optimizer applies 100 bytes per device at 0.01 s a byte: +1 s.
@pytest.mark.parametrize("remat,want", [("never", 12.0), ("always", 15.0), ("except_last", 14.0)])
def test_predicted_seconds_equal_a_hand_computed_schedule(remat, want):
    rates = planner.Rates(1.0, action_s=0.5, bytes_per_s=1e30, latency_s=0.0)
    assert _Predict("1f1b", remat, rates) == pytest.approx(want)
    with_apply = dataclasses.replace(rates, apply_s_per_byte=0.01)
    assert _Predict("1f1b", remat, with_apply) == pytest.approx(want + 1.0)
    # One policy per stage: stage 0 as 'always' (its B's replay), stage 1 as 'never'.
    mixed = _Predict("1f1b", ["always", "never"], rates)
    # dev 1: B0 [3, 5.5], F1, B1 [7, 9.5]; dev 0: B0 [5.5, 9], B1 [9.5, 13].
    assert mixed == pytest.approx(13.0)


def test_the_transfer_is_paid_where_a_stage_s_neighbour_is_on_another_device():
    # 1000 bytes per example, micro-batches of 2, at 1000 bytes/s plus 0.25 s: 2.25 s on
    # F s1 (its inputs) and on B s0 (their gradient back). GPipe, K=2, M=2, no fixed cost:
    #   dev 0: F0 [0, 1] F1 [1, 2]                      B1 [9.5, 13.75] B0 [13.75, 18]
    #   dev 1: F0 [1, 4.25] F1 [4.25, 7.5] B1 [7.5, 9.5] B0 [9.5, 11.5]
    # (dev 0's backwards: 2 + 2.25 each; B1 waits for dev 1's B1, B0 for dev 0.)
    rates = planner.Rates(1.0, action_s=0.0, bytes_per_s=1000.0, latency_s=0.25)
    assert _Predict("gpipe", "never", rates) == pytest.approx(18.0)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zero_bubble", "zbv", "v_half"])
def test_the_fixed_cost_enters_once_per_action(schedule):
    # Cells that take no time: the step is the fixed cost times the makespan in actions,
    # a whole B one action, an I and a W two.
    free = cost_model.CellTimes(((0.0, 0.0),) * 4, ((0.0, 0.0),) * 4, ((0.0, 0.0),) * 4)
    costs = planner.ModelCosts((1.0,) * 4, (0,) * 4, (0,) * 4, free)
    rates = planner.Rates(1.0, action_s=0.003, bytes_per_s=1e30, latency_s=0.0)
    sched = generators.Make(schedule, 2, 4)
    counts = (1,) * sched.num_stages
    c = planner.Candidate(1, 2, 4, schedule, 1, "never", counts)
    units = simulate.Simulate(sched, {k: 1.0 for k in "FBIW"}).makespan
    got = planner.PredictSeconds(c, costs, rates, 8)
    assert got == pytest.approx(0.003 * units)


def test_without_a_profile_the_cells_take_their_flops_at_the_measured_rate():
    rates = planner.Rates(2.0, action_s=0.0, bytes_per_s=1e30, latency_s=0.0)
    costs = dataclasses.replace(TWO_CELLS, times=None)  # 1 FLOP per example per cell
    # Micro-batches of 2 at 2 FLOP/s: F = I = W = 1 s, as ONE_SECOND; 1F1B without a
    # fixed cost: dev 1 F0 [1, 2] B0 [2, 4] F1 [4, 5] B1 [5, 7]; dev 0 B1 [7, 9].
    c = planner.Candidate(1, 2, 2, "1f1b", 1, "never", (1, 1))
    assert planner.PredictSeconds(c, costs, rates, global_batch=4) == pytest.approx(9.0)


def test_each_micro_batch_adds_its_weight_gradients_to_the_sum():
    # 100 weight bytes per cell at 0.005 s a byte: every B pays 0.5 s more, and the step
    # 0.5 s for the sums' final scaling (one pass over each device's weights).
    #   dev 1: F0 [1, 2] B0 [2, 4.5] F1 [4.5, 5.5] B1 [5.5, 8]
    #   dev 0: F0 [0, 1] F1 [1, 2] B0 [4.5, 7] B1 [8, 10.5]          -> 10.5 + 0.5
    rates = planner.Rates(1.0, action_s=0.0, bytes_per_s=1e30, latency_s=0.0)
    assert _Predict("1f1b", "never", rates) == pytest.approx(9.0)
    summing = dataclasses.replace(rates, add_s_per_byte=0.005)
    assert _Predict("1f1b", "never", summing) == pytest.approx(11.0)
    # Zero bubble: the sum is paid by W, not by I.
    sched = generators.Make("zero_bubble", 2, 2)
    c = planner.Candidate(1, 2, 2, "zero_bubble", 1, "never", (1, 1))
    per_kind = planner.ActionSeconds(c, TWO_CELLS, summing, 4)
    assert per_kind["W"][(0, 1)] == pytest.approx(1.5)
    assert per_kind["I"][(0, 1)] == pytest.approx(1.0)
    assert sched.has_backward


def test_each_weight_pays_its_own_cost_in_the_sums_and_the_apply():
    # A cost per weight (per variable) beside its bytes: 0.1 s to add one to a sum, 0.2 s
    # to apply one. Stage 0 holds 3 weights, stage 1 holds 5: every B of stage 0 pays
    # 0.3 s more, of stage 1 0.5 s; the step pays the sums' scaling (0.5 s, the device
    # with more) and the apply (1.0 s), each device its own in parallel.
    #   dev 1: F0 [1, 2] B0 [2, 4.5] F1 [4.5, 5.5] B1 [5.5, 8]
    #   dev 0: F0 [0, 1] F1 [1, 2] B0 [4.5, 6.8] B1 [8, 10.3]          -> 10.3 + 1.5
    rates = planner.Rates(1.0, action_s=0.0, bytes_per_s=1e30, latency_s=0.0)
    per_weight = dataclasses.replace(rates, add_s_per_weight=0.1, apply_s_per_weight=0.2)
    counted = dataclasses.replace(TWO_CELLS, weight_counts=(3, 5))
    c = planner.Candidate(1, 2, 2, "1f1b", 1, "never", (1, 1))
    assert planner.PredictSeconds(c, counted, per_weight, global_batch=4) == pytest.approx(11.8)
    # Costs that do not count their weights (FLOP-only costs of a model not built) pay none.
    assert planner.PredictSeconds(c, TWO_CELLS, per_weight, global_batch=4) == pytest.approx(9.0)
    # Zero bubble: W pays the weights' additions, I none.
    z = planner.Candidate(1, 2, 2, "zero_bubble", 1, "never", (1, 1))
    per_kind = planner.ActionSeconds(z, counted, per_weight, 4)
    assert per_kind["W"][(1, 0)] == pytest.approx(1.5)
    assert per_kind["I"][(1, 0)] == pytest.approx(1.0)


def test_contention_slows_the_compute_where_several_devices_compute():
    # A pipeline's devices are contended only while two of them run at once. Uncontended
    # (F = 1.5, B = 2.5): dev 0: F0 [0, 1.5] F1 [1.5, 3] B0 [5.5, 8] B1 [9.5, 12];
    # dev 1: F0 [1.5, 3] B0 [3, 5.5] F1 [5.5, 7] B1 [7, 9.5]. Both run in [1.5, 3]
    # (two F: contended 2 x 1 + 0.5 against 1.5), [5.5, 7] and [7, 8] (a B among them:
    # 2 x 2 + 0.5 against 2.5), each second stretched by the largest ratio less 1:
    # 12 + 1.5 x (2.5 / 1.5 - 1) + 2.5 x (4.5 / 2.5 - 1).
    rates = planner.Rates(1.0, action_s=0.5, bytes_per_s=1e30, latency_s=0.0, contention=2.0)
    assert _Predict("1f1b", "never", rates) == pytest.approx(15.0)
    # GPipe with one micro-batch never runs two devices at once: no contention at all.
    one = planner.Candidate(1, 2, 1, "gpipe", 1, "never", (1, 1))
    free = dataclasses.replace(rates, contention=1.0)
    assert planner.PredictSeconds(one, TWO_CELLS, rates, 4) == pytest.approx(
        planner.PredictSeconds(one, TWO_CELLS, free, 4)
    )
    # One device alone computes uncontended: 2 x F (2 cells + 0.5) + 2 x B (4 + 0.5).
    alone = planner.Candidate(1, 1, 2, "gpipe", 1, "never", (2,))
    assert planner.PredictSeconds(alone, TWO_CELLS, rates, 4) == pytest.approx(14.0)
    # Two replicas of it compute at once: contended.
    pair = dataclasses.replace(alone, replicas=2)
    fast = dataclasses.replace(rates, bytes_per_s=1e30, latency_s=0.0)
    assert planner.PredictSeconds(pair, TWO_CELLS, fast, 8) == pytest.approx(2 * 4.5 + 2 * 8.5)


def test_the_calibrated_costs_scale_the_cells_and_replace_the_fixed_cost():
    cal = calibrate.Calibration((1.5, 2.5), 0.1, 0.2, 1.0, 10, step_s=0.7)
    rates = planner.Rates(2.0, action_s=0.0, bytes_per_s=1e30, latency_s=0.0)
    costs, cal_rates = planner.Calibrated(TWO_CELLS, rates, cal)
    assert costs.times.forward == ((2.0, 0.0),) * 2 and cal_rates.action_s == pytest.approx(0.3)
    # The fixed cost per step is added once to every candidate's step.
    one = planner.Candidate(1, 2, 2, "1f1b", 1, "never", (1, 1))
    without = dataclasses.replace(cal_rates, step_s=0.0)
    assert planner.PredictSeconds(one, costs, cal_rates, 4) == pytest.approx(
        planner.PredictSeconds(one, costs, without, 4) + 0.7
    )
    flops = dataclasses.replace(TWO_CELLS, times=None)
    flops_costs, flops_rates = planner.Calibrated(flops, rates, cal)
    assert flops_costs.times is None and flops_rates.flops_per_s == pytest.approx(1.0)
    # What calibrate.Fit compares with the timeline: each action's compute, no fixed cost.
    c = planner.Candidate(1, 2, 2, "1f1b", 1, "never", (1, 1))
    compute = planner.Compute(c, costs, cal_rates, 4)
    assert len(compute) == 8
    assert {round(v, 6) for v in compute.values()} == {2.0, 4.0}


def test_calibration_probes_are_the_candidate_and_its_1f1b_twin_at_a_far_micro_batch_count():
    zbv = planner.Candidate(2, 2, 4, "zbv", 1, "never", (2, 2, 2, 2), "flops")
    probes = planner.CalibrationProbes(zbv, COSTS, 32)
    assert [p.Describe() for p in probes] == [
        "R=1 x K=2, M=4, zbv, remat=never, partition=flops [2, 2, 2, 2]",
        # 16 micro-batches is as far from 4 as 1 is, and has more actions; one stage per
        # device, cut again by the same policy.
        "R=1 x K=2, M=16, 1f1b, remat=never, partition=flops [4, 4]",
    ]
    # A replica's batch of 8 allows M=1 at most 8: the farthest from 8 is 1.
    big = dataclasses.replace(zbv, num_micro_batches=8, replicas=4)
    assert [p.num_micro_batches for p in planner.CalibrationProbes(big, COSTS, 32)] == [8, 1]
    # One device: nothing to pair.
    alone = planner.Candidate(1, 1, 2, "gpipe", 1, "never", (8,))
    assert len(planner.CalibrationProbes(alone, COSTS, 32)) == 1


def test_a_backward_alone_on_its_device_takes_its_profiled_time_and_contended_i_plus_w():
    # Both gradients in one action take 1.5 s per cell on a device alone (a CPU's
    # threads run them at once), 2 s (I + W) while another device computes.
    fast_b = dataclasses.replace(ONE_SECOND, backward=((1.5, 0.0),) * 2)
    costs = dataclasses.replace(TWO_CELLS, times=fast_b)
    rates = planner.Rates(1.0, action_s=0.0, bytes_per_s=1e30, latency_s=0.0)
    # GPipe, K=2, M=1 never runs two devices at once: F 1 + 1, B 1.5 + 1.5.
    chain = planner.Candidate(1, 2, 1, "gpipe", 1, "never", (1, 1))
    assert planner.PredictSeconds(chain, costs, rates, 2) == pytest.approx(5.0)
    assert planner.PredictSeconds(chain, TWO_CELLS, rates, 2) == pytest.approx(6.0)
    # What calibration compares with the busy times: each B as it ran, alone.
    assert sorted(planner.Compute(chain, costs, rates, 2).values()) == [1.0, 1.0, 1.5, 1.5]
    # 1F1B at M=2: device 1's B0 [2, 3.5] runs beside device 0's F1 [1, 2] not at all,
    # and its B1 [4.5, 6] beside device 0's B0 [3.5, 5] for 0.5 of its 1.5 s.
    both = planner.Candidate(1, 2, 2, "1f1b", 1, "never", (1, 1))
    compute = planner.Compute(both, costs, rates, 4)
    b1 = next(a for a in compute if (a.kind, a.stage, a.micro_batch) == ("B", 1, 1))
    assert compute[b1] == pytest.approx(1.5 + 0.5 / 1.5 * (2.0 - 1.5))
    # Two replicas always compute together: B = I + W = 4 s on each device.
    pair = planner.Candidate(2, 1, 1, "gpipe", 1, "never", (2,))
    assert planner.PredictSeconds(pair, costs, rates, 2) == pytest.approx(2.0 + 4.0, rel=1e-6)
    # A profile's B is never taken above I + W.
    slow_b = dataclasses.replace(ONE_SECOND, backward=((3.0, 0.0),) * 2)
    assert slow_b.BackwardAlone([0, 1], 1) == pytest.approx(4.0)


def test_a_backward_beside_another_device_takes_its_measured_together_time_not_i_plus_w():
    # I and W each start from the outputs' gradient, which a B makes once: measured
    # beside another device computing, both gradients take 2.5 s per cell, not I + W = 2
    # x 2 s (the contention's 2x is in the reading: it is not applied again).
    times = dataclasses.replace(ONE_SECOND, backward_together=((2.5, 0.0),) * 2)
    costs = dataclasses.replace(TWO_CELLS, times=times)
    rates = planner.Rates(1.0, action_s=0.0, bytes_per_s=1e30, latency_s=0.0, contention=2.0)
    pair = planner.Candidate(2, 1, 1, "gpipe", 1, "never", (2,))
    # Two replicas: F 2 x 1 s x 2 (contended), B 2 x 2.5 s.
    assert planner.PredictSeconds(pair, costs, rates, 2) == pytest.approx(4.0 + 5.0, rel=1e-6)
    assert planner.PredictSeconds(pair, TWO_CELLS, rates, 2) == pytest.approx(4.0 + 8.0, rel=1e-6)
    # A device alone still takes its profiled B (here I + W: no 'backward' lines).
    chain = planner.Candidate(1, 2, 1, "gpipe", 1, "never", (1, 1))
    assert planner.PredictSeconds(chain, costs, rates, 2) == pytest.approx(6.0)
    # A calibration's scale scales the together lines too.
    assert times.Scaled(2.0).BackwardTogether([0, 1], 1) == pytest.approx(10.0)
    assert ONE_SECOND.BackwardTogether([0], 1) is None


def test_replicas_of_cells_profiled_beside_a_copy_are_slowed_by_their_reading_at_their_size():
    # Replicas run the same cells at once, as the profile's copies did. The device's one
    # factor (2.0, read on large matmuls) against each cell's forward timed beside a
    # copy: 1.5 s at one example (1.5x its 1 s alone), 3 s at three (a line 0.75 +
    # 0.75 n; 1.0x its 3 s alone).
    per_example = cost_model.CellTimes(((0.0, 1.0),) * 2, ((0.0, 1.0),) * 2, ((0.0, 1.0),) * 2)
    beside = dataclasses.replace(per_example, forward_together=((0.75, 0.75),) * 2)
    assert beside.Contention([0, 1], 1, device=2.0) == pytest.approx(1.5)
    assert beside.Contention([0, 1], 3, device=2.0) == pytest.approx(1.0)
    assert per_example.Contention([0, 1], 1, device=2.0) == 2.0  # not profiled so
    rates = planner.Rates(1.0, action_s=0.0, bytes_per_s=1e30, latency_s=0.0, contention=2.0)
    pair = planner.Candidate(2, 1, 1, "gpipe", 1, "never", (2,))
    for batch, factor in ((2, 1.5), (6, 1.0)):  # each replica: 1 and 3 examples
        n = batch // 2
        # F, I and W of both cells, each n seconds alone, times the cells' own factor.
        want = 2 * 3 * n * factor
        costs = dataclasses.replace(TWO_CELLS, times=beside)
        assert planner.PredictSeconds(pair, costs, rates, batch) == pytest.approx(want)
        flat = dataclasses.replace(TWO_CELLS, times=per_example)
        assert planner.PredictSeconds(pair, flat, rates, batch) == pytest.approx(2 * 3 * n * 2.0)
    # A device alone is not slowed, whatever the reading.
    one = planner.Candidate(1, 1, 1, "gpipe", 1, "never", (2,))
    costs = dataclasses.replace(TWO_CELLS, times=beside)
    assert planner.PredictSeconds(one, costs, rates, 1) == pytest.approx(2 * 3 * 1.0)
    # A pipeline's stages overlap different work, not a copy of theirs: the device's
    # factor, as without the readings.
    for m in (1, 4):
        chain = planner.Candidate(1, 2, m, "1f1b", 1, "never", (1, 1))
        flat = dataclasses.replace(TWO_CELLS, times=per_example)
        assert planner.PredictSeconds(chain, costs, rates, 8) == pytest.approx(
            planner.PredictSeconds(chain, flat, rates, 8)
        )
    # A calibration's scale scales the readings with the times: the factor stays.
    assert beside.Scaled(3.0).Contention([0], 1, device=2.0) == pytest.approx(1.5)


def test_contention_is_the_least_reading_as_a_slowed_period_only_raises_one(monkeypatch):
    # Readings of together / alone: 1.9 (the host's cores slowed for a while), 1.0,
    # 1.9. The least is the machine's.
    times = iter([1.0, 1.9, 1.0, 1.0, 1.0, 1.9])
    monkeypatch.setattr(device_rates, "Best", lambda fn, repeats: next(times))
    devices = ["/device:CPU:0", "/device:CPU:1"]
    assert device_rates.MeasureContention(devices, rounds=3, pause_s=0.0) == pytest.approx(1.0)
    assert device_rates.MeasureContention(devices[:1]) == 1.0


def test_a_transfer_is_a_crossing_inside_one_function_less_the_same_work_on_one_device(
    monkeypatch,
):
    # Readings (seconds of a chain of 4 hops): one float across, one float on one
    # device, 4 MiB across, 4 MiB on one device. The chains' own work and the
    # function's call are in both readings of a size and cancel.
    readings = iter([0.2 + 4 * 5e-6, 0.2, 0.5 + 4 * (5e-6 + 1e-3), 0.5])
    monkeypatch.setattr(device_rates, "Best", lambda fn, repeats: next(readings))
    bytes_per_s, latency_s = device_rates.MeasureTransfer("/device:CPU:0", "/device:CPU:1", hops=4)
    assert latency_s == pytest.approx(5e-6)
    assert bytes_per_s == pytest.approx(4 * 2**20 / 1e-3)
    # Logical CPU devices hand a tensor over without copying it: 4 MiB cross no slower
    # than a float. The bandwidth is then what a microsecond resolves, not infinite.
    readings = iter([0.2 + 4 * 5e-6, 0.2, 0.5 + 4 * 4e-6, 0.5])
    assert device_rates.MeasureTransfer("/device:CPU:0", "/device:CPU:1", hops=4) == (
        pytest.approx(4 * 2**20 / 1e-6),
        pytest.approx(5e-6),
    )
    # One device: nothing crosses, nothing is measured.
    assert device_rates.MeasureTransfer("/device:CPU:0", "/device:CPU:0")[1] == 0.0


def test_the_transfer_s_chain_crosses_at_every_hop_and_its_twin_never():
    import tensorflow as tf

    here, there = "/device:CPU:0", "/device:CPU:1"
    x = tf.ones([1])
    for cross, expected in ((True, [1, 0, 1, 0]), (False, [0, 0, 0, 0])):
        chain = device_rates._Chain(here, there, 4, cross)  # noqa: SLF001
        ops = chain.get_concrete_function(x, x).graph.get_operations()
        placed = [tf.DeviceSpec.from_string(op.device) for op in ops if op.type == "Mul"]
        assert [(p.device_type, p.device_index) for p in placed] == [("CPU", i) for i in expected]


def test_measured_rates_take_the_transfer_inside_a_step_not_a_function_s_call(monkeypatch):
    # The latency once read a whole function's call (about 0.2 ms here), where a
    # step's crossings are ops inside one call (a few microseconds): the MLP's K=2
    # rows at M=16 were predicted 4 ms over by it.
    for name, value in dict(
        MeasureFlopsPerSecond=1e11, MeasureActionSeconds=1e-5, MeasureApplySecondsPerByte=1e-9,
        MeasureAddSecondsPerByte=1e-10, MeasureContention=1.5,
        MeasureTransfer=(3e10, 4e-6), MeasureWeightSeconds=(2e-5, 1e-6),
    ).items():  # fmt: skip
        monkeypatch.setattr(device_rates, name, lambda *a, v=value, **k: v)
    rates = planner.MeasureRates()
    assert (rates.bytes_per_s, rates.latency_s) == (3e10, 4e-6)
    assert (rates.flops_per_s, rates.action_s, rates.contention) == (1e11, 1e-5, 1.5)
    assert (rates.apply_s_per_byte, rates.add_s_per_byte) == (1e-9, 1e-10)
    assert (rates.apply_s_per_weight, rates.add_s_per_weight) == (2e-5, 1e-6)


def test_the_screen_says_when_nothing_was_refused():
    from lingpipe.pipeline.planning import report

    roomy, tight = _Search(2**30), _Search(48 * 2**20)
    screen = report.PlanScreen("plan", roomy.chosen, "what", "how", roomy.runners_up, [])
    assert screen.splitlines()[-1] == "refused: none, every candidate fits the cap"
    screen = report.PlanScreen("plan", tight.chosen, "what", "how", [], tight.refused)
    assert f"refused ({len(tight.refused)}, over the cap):" in screen.splitlines()


def test_schedules_named_are_the_planner_s_entries_in_its_order():
    # Each named schedule as the default search lists it, in SCHEDULES' order however
    # given: the command line, the trainer's flags and the Keras keywords all map names so.
    assert planner.SchedulesNamed(["interleaved_1f1b", "gpipe", "gpipe"]) == (
        ("gpipe", 1),
        ("interleaved_1f1b", 2),
    )
    # A training schedule the default search leaves out: 2 stages per device where its
    # stages are placed in a loop, else 1; after the listed ones, in the order given.
    assert planner.SchedulesNamed(["looped_bfs", "dualpipev", "1f1b"]) == (
        ("1f1b", 1),
        ("looped_bfs", 2),
        ("dualpipev", 1),
    )
    # The trainer's --num_virtual_stages picks among them, or is taken as given.
    assert planner.SchedulesNamed(["interleaved_1f1b"], 3) == (("interleaved_1f1b", 3),)
    assert planner.SchedulesNamed(["1f1b"], 1) == (("1f1b", 1),)


def test_the_first_stage_leaves_out_its_inputs_gradient_up_to_its_first_weights():
    def Costs(weights, **kw):
        n = len(weights)
        times = cost_model.CellTimes(((1.0, 0.0),) * n, ((1.0, 0.0),) * n, ((1.0, 0.0),) * n)
        return planner.ModelCosts((1.0,) * n, (1000,) * n, weights, times, **kw)

    # Nothing before the first cell with weights can take the gradient it passes back.
    assert planner.FirstStageWithoutInputGradient(Costs((100, 100, 100)), 3) == (0,)
    assert planner.FirstStageWithoutInputGradient(Costs((0, 0, 100, 100)), 4) == (0, 1, 2)
    assert planner.FirstStageWithoutInputGradient(Costs((0, 0, 100)), 2) == (0, 1)
    # Layers with weights before the pipeline read its inputs' gradient: all of it.
    assert planner.FirstStageWithoutInputGradient(Costs((100,) * 3, input_gradient=True), 3) == ()
    rates = planner.Rates(1.0, action_s=0.0, bytes_per_s=1e30, latency_s=0.0)
    # GPipe, K=2, M=1, a cell a stage, 1 s per kind: F 1 + 1, then B 2 (I + W) on stage 1
    # and 1 (W alone) on stage 0.
    chain = planner.Candidate(1, 2, 1, "gpipe", 1, "never", (1, 1))
    assert planner.PredictSeconds(chain, Costs((100, 100)), rates, 2) == pytest.approx(5.0)
    assert planner.PredictSeconds(
        chain, Costs((100, 100), input_gradient=True), rates, 2
    ) == pytest.approx(6.0)
    # Zero bubble splits them: stage 0's I costs nothing, its W 1 s.
    split = planner.Candidate(1, 2, 1, "zero_bubble", 1, "never", (1, 1))
    seconds = planner.ActionSeconds(split, Costs((100, 100)), rates, 2)
    assert seconds["I"][(0, 0)] == pytest.approx(0.0, abs=1e-9)  # the outputs' gradient's arrival
    assert seconds["I"][(1, 0)] == seconds["W"][(0, 0)] == seconds["W"][(1, 0)] == 1.0
    # A profiled B (both gradients at once) and one beside another device: stage 0 takes
    # its W for the cell without the inputs' gradient.
    times = dataclasses.replace(
        Costs((100, 100)).times, backward=((1.5, 0.0),) * 2, backward_together=((2.5, 0.0),) * 2
    )
    profiled = dataclasses.replace(Costs((100, 100)), times=times)
    alone = planner.ActionSeconds(chain, profiled, rates, 2, contended=False)
    together = planner.ActionSeconds(chain, profiled, rates, 2)
    assert (alone["B"][(0, 0)], alone["B"][(1, 0)]) == (1.0, 1.5)
    assert (together["B"][(0, 0)], together["B"][(1, 0)]) == (1.0, 2.5)


def test_a_first_cell_whose_inputs_have_no_gradient_keeps_its_profiled_backward():
    # An embedding's inputs are token ids: its profile has no I, and its B (alone and
    # beside another device) was its weights' gradient all along. It is kept, not
    # replaced by W times the contention.
    times = cost_model.CellTimes(
        ((1.0, 0.0),) * 2,
        ((0.0, 0.0), (1.0, 0.0)),
        ((1.0, 0.0),) * 2,
        backward_together=((1.25, 0.0), (2.5, 0.0)),
    )
    costs = planner.ModelCosts((1.0, 1.0), (1000, 1000), (100, 100), times)
    rates = planner.Rates(1.0, action_s=0.0, bytes_per_s=1e30, latency_s=0.0, contention=2.0)
    chain = planner.Candidate(1, 2, 1, "gpipe", 1, "never", (1, 1))
    together = planner.ActionSeconds(chain, costs, rates, 2)
    assert (together["B"][(0, 0)], together["B"][(1, 0)]) == (1.25, 2.5)
