"""Calibration recovers known parameters from synthetic timelines."""

import pytest

from lingpipe.pipeline.observe import timeline
from lingpipe.pipeline.planning import calibrate
from lingpipe.pipeline.schedules import generators, simulate


def _Synthetic(sched, compute, scales, overhead, gap, steps=2):
    """Spans as a device would record them: each action busy for scale * compute +
    overhead, and `gap` more per action between its ops (not busy)."""
    costs = {k: {} for k in "FBIW"}
    for a, seconds in compute.items():
        busy = scales[sched.DeviceOf(a.stage)] * seconds + overhead
        costs[a.kind][(a.stage, a.micro_batch)] = busy + gap
    sim = simulate.Simulate(sched, costs)
    spans = []
    for step in range(steps):
        origin = step * (sim.makespan + 1.0)
        for a in sim.start:
            busy = costs[a.kind][(a.stage, a.micro_batch)] - gap
            start, end = (origin + sim.start[a]) * 1e6, (origin + sim.end[a]) * 1e6
            spans.append(timeline.Span(step, a, sched.DeviceOf(a.stage), start, end, 3, busy * 1e6))
    return spans, sim.makespan


@pytest.mark.parametrize("schedule", ["1f1b", "zero_bubble", "zbv"])
def test_calibration_recovers_the_device_scales_and_the_fixed_cost(schedule):
    sched = generators.Make(schedule, 2, 4)
    # Stages cost differently, and B (or I) more than F, so the fit is determined.
    compute = {
        a: (1 + a.stage) * {"F": 1e-3, "B": 2.2e-3, "I": 1.1e-3, "W": 0.9e-3}[a.kind]
        for acts in sched.device_actions
        for a in acts
    }
    spans, makespan = _Synthetic(sched, compute, (1.5, 0.8), 2e-4, 0.0)
    cal = calibrate.Fit(spans, sched, compute)
    assert cal.scales == pytest.approx((1.5, 0.8), rel=1e-6)
    assert cal.overhead_s == pytest.approx(2e-4, rel=1e-6)
    assert cal.step_overhead_s == pytest.approx(0.0, abs=1e-9)
    assert cal.measured_step_s == pytest.approx(makespan)
    assert cal.num_actions == 2 * sum(len(acts) for acts in sched.device_actions)


def test_the_gaps_between_ops_are_fitted_to_the_measured_step():
    sched = generators.Make("1f1b", 2, 4)
    compute = {a: 1e-3 * (2 if a.kind == "B" else 1) for acts in sched.device_actions for a in acts}
    spans, _ = _Synthetic(sched, compute, (1.0, 1.0), 1e-4, 3e-4)
    cal = calibrate.Fit(spans, sched, compute)
    assert cal.overhead_s == pytest.approx(1e-4, rel=1e-6)
    assert cal.step_overhead_s == pytest.approx(3e-4, rel=1e-6)
    assert cal.action_s == pytest.approx(4e-4, rel=1e-6)
    # A step timed without the profiler (faster) lowers the gap, not the busy fit.
    unprofiled = calibrate.Fit(spans, sched, compute, measured_step_s=cal.measured_step_s * 0.9)
    assert unprofiled.overhead_s == pytest.approx(1e-4, rel=1e-6)
    assert 0 < unprofiled.step_overhead_s < 3e-4
    assert unprofiled.measured_step_s == pytest.approx(cal.measured_step_s * 0.9)


def test_spans_of_another_schedule_are_refused_by_name():
    sched = generators.Make("1f1b", 2, 2)
    compute = {a: 1e-3 for acts in sched.device_actions for a in acts}
    other = generators.Make("zero_bubble", 2, 2)
    spans, _ = _Synthetic(other, {a: 1e-3 for acts in other.device_actions for a in acts},
                          (1.0, 1.0), 0.0, 0.0)  # fmt: skip
    with pytest.raises(ValueError, match=r"^calibrate: expected spans of the actions of "
                       r"schedule '1f1b', received spans of I s0 mb0"):  # fmt: skip
        calibrate.Fit(spans, sched, compute)
    with pytest.raises(ValueError, match=r"received none$"):
        calibrate.Fit([], sched, compute)


def test_a_fit_that_would_need_a_negative_overhead_has_none():
    # Busy time proportional to compute with noise that a free fit reads as a negative
    # fixed cost (busy 0.9 ms at compute 1 ms, 2.1 ms at 2 ms): the overhead is 0 and
    # each device's scale its busy over compute, by least squares through the origin.
    rows = [(0, 1e-3, 0.9e-3), (0, 2e-3, 2.1e-3), (1, 1e-3, 0.9e-3), (1, 2e-3, 2.1e-3)]
    scales, overhead = calibrate.FitBusy(rows, 2)
    assert overhead == 0.0
    want = (0.9 * 1 + 2.1 * 2) / (1 + 4)
    assert scales == pytest.approx((want, want))
    # Equal compute everywhere (FLOPs): the fit is undetermined; no scale <= 0.
    flat = [(0, 1e-3, 5e-3), (0, 1e-3, 6e-3), (1, 1e-3, 4e-3)]
    scales, overhead = calibrate.FitBusy(flat, 2)
    assert overhead >= 0 and all(v > 0 for v in scales)


def test_two_probes_separate_the_cost_per_action_from_the_cost_per_step():
    # Two configurations with different numbers of actions and micro-batch sizes: each
    # action busy scale * compute + overhead, `gap` more per action between ops, and a
    # fixed `step` per step outside every action. One probe cannot tell gap from step;
    # two recover both.
    probes, truth = [], dict(scales=(1.3, 0.9), overhead=1e-4, gap=2e-4, step=5e-3)
    for m, size in ((2, 4.0), (8, 1.0)):
        sched = generators.Make("1f1b", 2, m)
        compute = {
            a: size * (1 + a.stage) * {"F": 1e-3, "B": 2e-3}[a.kind]
            for acts in sched.device_actions
            for a in acts
        }
        spans, makespan = _Synthetic(
            sched, compute, truth["scales"], truth["overhead"], truth["gap"]
        )
        probes.append(calibrate.Probe(spans, sched, compute, makespan + truth["step"]))
    cal = calibrate.FitProbes(probes)
    assert cal.scales == pytest.approx(truth["scales"], rel=1e-6)
    assert cal.overhead_s == pytest.approx(truth["overhead"], rel=1e-6)
    assert cal.step_overhead_s == pytest.approx(truth["gap"], rel=1e-4)
    assert cal.step_s == pytest.approx(truth["step"], rel=1e-4)
    assert cal.num_probes == 2
    # The first probe alone: its whole excess is charged per action, none per step.
    one = calibrate.FitProbes(probes[:1])
    assert one.step_s == 0.0 and one.step_overhead_s > truth["gap"]
