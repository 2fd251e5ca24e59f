"""Calibrating the cost model against measured timelines.

    spans = timeline.Record(step_fn, logdir, pipeline, num_steps=3)
    cal = calibrate.Fit(spans, sched, compute)       # compute: {Action: predicted s}
    cal = calibrate.FitProbes([calibrate.Probe(spans, sched, compute, step_s), ...])
    costs, rates = planner.Calibrated(costs, rates, cal)

A probe is one pipeline configuration, recorded: the timeline's spans of its actions,
its schedule, the cost model's compute of each action (its cells' times, no fixed
cost) and its measured makespan. The measured busy time of each action
(timeline.Span.busy_us: its ops running, not the waits inside its span) is fitted by
least squares over every recorded action of every probe as

    busy(a) = scale[device of a] * compute(a) + overhead

a scale per device (how much slower or faster the device runs the cells than profiled)
and one fixed cost per action. Probes whose micro-batches differ in size give actions of
different compute, which is what separates the scale from the fixed cost.

The gaps between an action's ops and between actions (the executor's scheduling) are
not busy time. With the fitted costs, each probe's schedule is simulated, and what it
still lacks against the measured makespan is fitted as

    measured(p) = simulated(p, per action: overhead + step_overhead) + step_s

one further time per action (`step_overhead_s`) and one per step (`step_s`), both >= 0,
by least squares over the probes. Probes with different numbers of actions separate
the two; one probe alone gives step_s = 0 and the per-action time that reproduces its
makespan.
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
    "FitProbes",
    "Probe",
]


@dataclasses.dataclass(frozen=True)
class Calibration:
    """What a timeline says about the cost model (module doc).

    Attributes:
      scales: per device, measured compute / predicted compute.
      overhead_s: the fitted busy time of an action beyond its compute.
      step_overhead_s: the further time per action that the measured steps show.
      measured_step_s: the (first) probe's measured makespan.
      num_actions: how many recorded actions the fit used.
      step_s: the fixed time per step that the measured steps show.
      num_probes: how many configurations were recorded.
    """

    scales: tuple[float, ...]
    overhead_s: float
    step_overhead_s: float
    measured_step_s: float
    num_actions: int
    step_s: float = 0.0
    num_probes: int = 1

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


@dataclasses.dataclass(frozen=True)
class Probe:
    """One recorded configuration (module doc).

    Attributes:
      spans: timeline.Spans of one or more recorded steps of `sched`.
      sched: the schedule it ran.
      compute: {action of `sched`: the cost model's seconds of its cells}.
      measured_step_s: its makespan timed without the profiler (which slows a recorded
        step); None takes the recorded steps' mean makespan.
    """

    spans: Sequence
    sched: Schedule
    compute: Mapping[Action, float]
    measured_step_s: float | None = None

    def Check(self) -> None:
        """Raises ValueError for no spans, or spans of actions `compute` does not list."""
        missing = sorted({str(s.action) for s in self.spans if s.action not in self.compute})
        if not self.spans or missing:
            received = f"spans of {', '.join(missing[:5])} that it does not run"
            raise ValueError(
                f"calibrate: expected spans of the actions of schedule {self.sched.name!r}, "
                f"received {received if self.spans else 'none'}"
            )

    def Measured(self) -> float:
        if self.measured_step_s:
            return self.measured_step_s
        windows = []
        for i in sorted({s.step for s in self.spans}):
            mine = [s for s in self.spans if s.step == i]
            windows.append(max(s.end_us for s in mine) - min(s.start_us for s in mine))
        return sum(windows) / len(windows) / 1e6

    def Makespan(self, scales: Sequence[float], per_action: float) -> float:
        """The schedule simulated with each action's compute times its device's scale,
        plus `per_action`."""
        costs: dict = {k: {} for k in "FBIW"}
        for a, seconds in self.compute.items():
            costs[a.kind][(a.stage, a.micro_batch)] = (
                scales[self.sched.DeviceOf(a.stage)] * seconds + per_action
            )
        return simulate.Simulate(self.sched, costs).makespan


def Fit(
    spans: Sequence,
    sched: Schedule,
    compute: Mapping[Action, float],
    measured_step_s: float | None = None,
) -> Calibration:
    """The calibration from one probe (FitProbes): step_s is 0.

    Raises:
      ValueError: spans of actions that `compute` does not list, or no spans.
    """
    return FitProbes([Probe(spans, sched, compute, measured_step_s)])


def _StepFit(probes: Sequence[Probe], scales, overhead: float) -> tuple[float, float]:
    """(step_overhead, step_s) >= 0 by least squares over the probes (module doc)."""
    measured = [p.Measured() for p in probes]

    def Fit(gap: float) -> tuple[float, float]:
        """(step_s, squared error) at this per-action gap: each probe simulated once."""
        residuals = [m - p.Makespan(scales, overhead + gap) for p, m in zip(probes, measured)]
        step = max(0.0, sum(residuals) / len(residuals)) if len(probes) > 1 else 0.0
        return step, sum((r - step) ** 2 for r in residuals)

    def Loss(gap: float) -> float:
        return Fit(gap)[1]

    # The makespans grow with the per-action time; no probe's can exceed its measure.
    hi = max(measured)
    grid = [hi * (i / 64) ** 2 for i in range(65)]
    best = min(range(len(grid)), key=lambda i: Loss(grid[i]))
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    for _ in range(60):  # golden-section search in the best grid cell's neighbourhood
        a, b = lo + 0.382 * (hi - lo), lo + 0.618 * (hi - lo)
        if Loss(a) <= Loss(b):
            hi = b
        else:
            lo = a
    gap = (lo + hi) / 2
    return gap, Fit(gap)[0]


def FitProbes(probes: Sequence[Probe]) -> Calibration:
    """The calibration of the cost model against the recorded `probes` (module doc);
    they run on the same devices.

    Raises:
      ValueError: a probe without spans, or with spans of actions that its compute does
        not list.
    """
    for p in probes:
        p.Check()
    num_devices = max(p.sched.num_devices for p in probes)
    rows = [(s.device, p.compute[s.action], s.busy_us / 1e6) for p in probes for s in p.spans]
    scales, overhead = FitBusy(rows, num_devices)
    gap, step = _StepFit(probes, scales, overhead)
    return Calibration(
        scales, overhead, gap, probes[0].Measured(), len(rows), step_s=step, num_probes=len(probes)
    )
