"""Calibrating the cost model against a measured timeline.

    spans = timeline.Record(step_fn, logdir, pipeline, num_steps=3)
    cal = calibrate.Fit(spans, sched, compute)       # compute: {Action: predicted s}
    times, action_s = cal.Apply(times), cal.action_s

The measured busy time of each action (timeline.Span.busy_us: its ops running, not the
waits inside its span) is fitted by least squares over every recorded action as

    busy(a) = scale[device of a] * compute(a) + overhead

where compute(a) is the cost model's time for the action's cells (no fixed cost): a
scale per device (how much slower or faster the device runs the cells than profiled)
and one fixed cost per action. The gaps between an action's ops and between actions
(the executor's scheduling) are not busy time; `step_overhead_s` is what the
simulation with the fitted costs still lacks per action against the measured step
(first action's start to last action's end), found by bisection, so that
`action_s = overhead + step_overhead_s` reproduces the measured makespan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from lingpipe.pipeline.schedules import simulate
from lingpipe.pipeline.schedules.schedule import Action, Schedule

__all__ = [
    "Calibration",
    "Fit",
    "FitBusy",
]


@dataclasses.dataclass(frozen=True)
class Calibration:
    """What a timeline says about the cost model (module doc).

    Attributes:
      scales: per device, measured compute / predicted compute.
      overhead_s: the fitted busy time of an action beyond its compute.
      step_overhead_s: the further time per action that the measured step shows.
      measured_step_s: the recorded steps' mean makespan.
      num_actions: how many recorded actions the fit used.
    """

    scales: tuple[float, ...]
    overhead_s: float
    step_overhead_s: float
    measured_step_s: float
    num_actions: int

    @property
    def scale(self) -> float:
        """The devices' mean scale (what the planner applies to every device)."""
        return sum(self.scales) / len(self.scales)

    @property
    def action_s(self) -> float:
        return self.overhead_s + self.step_overhead_s


def FitBusy(
    busy: Sequence[tuple[int, float, float]], num_devices: int
) -> tuple[tuple[float, ...], float]:
    """(scale per device, overhead) by least squares over (device, compute, busy) rows,
    with the overhead >= 0 and every scale > 0: where the free fit breaks either (the
    compute of a device's actions nearly constant, as FLOPs make it, leaves the two
    undetermined), the overhead is 0 and each scale is the device's busy over compute.
    A device without rows (or without compute) keeps scale 1."""
    rows = np.zeros((len(busy), num_devices + 1))
    y = np.zeros(len(busy))
    for r, (device, compute, measured) in enumerate(busy):
        rows[r, device] = compute
        rows[r, -1] = 1.0
        y[r] = measured
    used = [d for d in range(num_devices) if rows[:, d].any()]
    solution, *_ = np.linalg.lstsq(rows[:, used + [num_devices]], y, rcond=None)
    overhead = float(solution[-1])
    if overhead < 0 or any(v <= 0 for v in solution[:-1]):
        overhead = 0.0
        solution = [rows[:, d] @ y / (rows[:, d] @ rows[:, d]) for d in used]
    scales = [1.0] * num_devices
    for d, value in zip(used, solution):
        scales[d] = float(value)
    return tuple(scales), overhead


def _Makespan(sched: Schedule, compute: Mapping[Action, float], scales, per_action: float):
    costs: dict = {k: {} for k in "FBIW"}
    for a, seconds in compute.items():
        costs[a.kind][(a.stage, a.micro_batch)] = (
            scales[sched.DeviceOf(a.stage)] * seconds + per_action
        )
    return simulate.Simulate(sched, costs).makespan


def Fit(
    spans: Sequence,
    sched: Schedule,
    compute: Mapping[Action, float],
    measured_step_s: float | None = None,
) -> Calibration:
    """The calibration of `compute` ({action of `sched`: predicted seconds of its cells})
    against `spans` (timeline.Spans of one or more recorded steps of `sched`).
    `measured_step_s`: the pipeline's makespan timed without the profiler (which slows
    a recorded step); None takes the recorded steps' mean makespan.

    Raises:
      ValueError: spans of actions that `compute` does not list, or no spans.
    """
    missing = sorted({str(s.action) for s in spans if s.action not in compute})
    if not spans or missing:
        raise ValueError(
            f"calibrate: expected spans of the actions of schedule {sched.name!r}, received "
            + (f"spans of {', '.join(missing[:5])} that it does not run" if spans else "none")
        )
    rows = [(s.device, compute[s.action], s.busy_us / 1e6) for s in spans]
    scales, overhead = FitBusy(rows, sched.num_devices)
    steps = sorted({s.step for s in spans})
    windows = [
        max(s.end_us for s in spans if s.step == i) - min(s.start_us for s in spans if s.step == i)
        for i in steps
    ]
    measured = measured_step_s or sum(windows) / len(windows) / 1e6
    lo, hi = 0.0, measured
    if _Makespan(sched, compute, scales, overhead) >= measured:
        hi = 0.0
    for _ in range(60):  # the makespan grows with the per-action time
        mid = (lo + hi) / 2
        if _Makespan(sched, compute, scales, overhead + mid) < measured:
            lo = mid
        else:
            hi = mid
    return Calibration(scales, overhead, (lo + hi) / 2, measured, len(spans))
