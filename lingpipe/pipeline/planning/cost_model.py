"""What each action of a schedule costs, in seconds, for the simulation to predict a step.

    times = cost_model.ProfileCells(parent_p, cells, input_specs, sizes=(2, 16))
    costs = cost_model.ActionCosts(sched, counts, times, micro_batch, rates, remat, out_bytes)
    seconds = simulate.Simulate(sched, costs).makespan + cost_model.OptimizerSeconds(...)

Per cell, three times for a micro-batch of n examples, each `fixed + per_example * n`
(fitted over the profiled sizes, `CellTimes`): the forward (F), the gradient of the
inputs (I) and of the weights (W). `ProfileCells` measures them on this process's
device, each cell on its own, traced once per kind: a forward, a forward with the
inputs' gradient, a forward with the weights' gradient, less the forward (and less
an empty function's call). Where a model is too big to run, `FlopTimes` takes its FLOPs
at a measured rate (I and W each as long as F).

An action then costs (`ActionCosts`):
  F s m: the stage's cells' forward + the fixed cost of one action + the transfer of its
    inputs from the previous stage's device (bytes / bandwidth + latency) if another;
  I s m: the inputs' gradient + the replayed forward if (s, m) is not kept (remat.Kept:
    'always', 'except_last', or one policy per stage) + one action + the transfer of
    its inputs' gradient back;
  W s m: the weights' gradient + its addition to the stage's running sum of them (the
    executor adds every micro-batch's, lingpipe.pipeline.step.gradient_sums: the stage's
    weight bytes at a measured rate per byte) + one action;
  B s m: I and W in one action (one fixed cost); on a device that no other contends
    with, as long as both gradients take together (CellTimes.BackwardAlone); beside
    another device computing, as measured so (CellTimes.BackwardTogether, which holds
    the contention), else I + W.
On the first stage, the cells up to its first cell with weights compute no inputs'
gradient, which nothing before them reads (planner.FirstStageWithoutInputGradient):
their I costs nothing and their B is their W.
Every time but the fixed cost and the transfers is multiplied by the contention: how
much slower a device computes while the other devices compute too (logical devices
sharing a host's cores; 1 where each device has its own), the device's one factor,
measured by planner.MeasureRates on 512 x 512 matmuls. Replicas run the same cells at
the same time on every device, which is what the profile times beside a copy: where it
did (CellTimes.forward_together), each stage of a replica takes its cells' own factor at
the micro-batch's size (CellTimes.Contention: small cells and large ones are slowed
differently). A pipeline's stages overlap different work for part of the time, and keep
the device's factor: its cells' readings beside a copy put the MLP's K=2 rows at M=16
28% to 71% over their measured step, where the device's factor has them within 14%.
planner.PredictSeconds passes it for replicas, which always compute together; a
pipeline's stages are costed uncontended and their overlap stretched afterwards.
The fixed cost of an action (device_rates.MeasureActionSeconds) is measured on the executor itself:
steps of a pipeline of tiny stages at two numbers of micro-batches, whose difference
over the difference of the simulated unit-cost makespans is the cost of one action.
The step adds what is not an action: the sums' final scaling (1 / the micro-batches'
weight, one pass over the weight bytes) and the optimizer's apply (its weights' bytes
at a measured rate), each device its own in parallel, and, with replicas, the
all-reduce. The apply and every addition to a sum also cost a fixed time per weight
(per variable: its ops' own cost, device_rates.MeasureWeightSeconds), which a model of many small
weights pays more than its bytes say.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from lingpipe.pipeline.planning import partition
from lingpipe.pipeline.schedules.schedule import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    Schedule,
)
from lingpipe.pipeline.step import remat as remat_lib

__all__ = [
    "ActionCosts",
    "CellTimes",
    "FitLine",
    "FlopTimes",
    "Line",
    "OptimizerSeconds",
]

Line = tuple[float, float]  # (fixed seconds, seconds per example)


def _Sum(lines: Sequence[Line], cells: Sequence[int], n: float) -> float:
    """The lines of `cells` at n examples, added."""
    return sum(lines[c][0] + lines[c][1] * n for c in cells)


@dataclasses.dataclass(frozen=True)
class CellTimes:
    """Per cell, seconds of its forward, inputs' gradient and weights' gradient for a
    micro-batch of n examples, each `fixed + per_example * n` (module doc).

    Attributes:
      forward, backward_input, backward_weight: one (fixed, per_example) per cell.
      source: 'profile' (measured) or 'flops' (FLOPs at a rate).
      backward: one line per cell for both gradients in one action on a device that
        no other device contends with, where that is faster than the two apart (a
        CPU's threads run the two gradients' independent ops at once); empty: I + W.
      backward_together: one line per cell for both gradients in one action while
        another device computes too (cell_times.TogetherSeconds); empty: I + W.
      forward_together: one line per cell for its forward while another device
        computes too (cell_times.TogetherSeconds); empty: the forward times the
        device's contention (Contention).
    """

    forward: tuple[Line, ...]
    backward_input: tuple[Line, ...]
    backward_weight: tuple[Line, ...]
    source: str = "profile"
    backward: tuple[Line, ...] = ()
    backward_together: tuple[Line, ...] = ()
    forward_together: tuple[Line, ...] = ()

    def Seconds(self, kind: str, cells: Sequence[int], n: float) -> float:
        """Seconds of `kind` (F, I, W, or B = I + W) over `cells` for n examples."""
        if kind == BACKWARD:
            return self.Seconds(BACKWARD_INPUT, cells, n) + self.Seconds(BACKWARD_WEIGHT, cells, n)
        lines = {
            FORWARD: self.forward,
            BACKWARD_INPUT: self.backward_input,
            BACKWARD_WEIGHT: self.backward_weight,
        }[kind]
        return _Sum(lines, cells, n)

    def BackwardAlone(self, cells: Sequence[int], n: float) -> float:
        """Seconds of both gradients in one action on an uncontended device: the
        `backward` lines, at most I + W."""
        apart = self.Seconds(BACKWARD, cells, n)
        if not self.backward:
            return apart
        return min(apart, _Sum(self.backward, cells, n))

    def BackwardTogether(self, cells: Sequence[int], n: float) -> float | None:
        """Seconds of both gradients in one action while another device computes:
        the `backward_together` lines; None where there are none (then I + W, each
        times the contention)."""
        if not self.backward_together:
            return None
        return _Sum(self.backward_together, cells, n)

    def Contention(self, cells: Sequence[int], n: float, device: float) -> float:
        """How much slower `cells` compute at n examples while another device computes:
        their forward beside a copy over alone (the `forward_together` lines, at least
        1), else `device`, the device's one factor (planner.Rates.contention)."""
        if not self.forward_together:
            return device
        alone = self.Seconds(FORWARD, cells, n)
        beside = _Sum(self.forward_together, cells, n)
        return max(1.0, beside / alone) if alone > 0 else device

    def Scaled(self, factor: float) -> CellTimes:
        """Every time times `factor` (a calibration's device scale)."""

        def Scale(lines: tuple[Line, ...]) -> tuple[Line, ...]:
            return tuple((a * factor, b * factor) for a, b in lines)

        return CellTimes(
            Scale(self.forward),
            Scale(self.backward_input),
            Scale(self.backward_weight),
            self.source,
            Scale(self.backward),
            Scale(self.backward_together),
            Scale(self.forward_together),
        )


def FlopTimes(flops: Sequence[float], flops_per_s: float) -> CellTimes:
    """Times from each cell's forward FLOPs per example at `flops_per_s`; I and W each
    as long as the forward (a matmul's two gradients)."""
    lines = tuple((0.0, f / flops_per_s) for f in flops)
    return CellTimes(lines, lines, lines, "flops")


def FitLine(sizes: Sequence[float], seconds: Sequence[float]) -> Line:
    """(fixed, per_example) through the measured (size, seconds): least squares over
    two or more sizes, both kept >= 0; one size gives per_example = seconds / size."""
    if len(sizes) == 1 or len(set(sizes)) == 1:
        return 0.0, max(0.0, sum(seconds) / sum(sizes))
    n = len(sizes)
    mx, my = sum(sizes) / n, sum(seconds) / n
    var = sum((x - mx) ** 2 for x in sizes)
    slope = sum((x - mx) * (y - my) for x, y in zip(sizes, seconds)) / var
    if slope < 0:
        return max(0.0, my), 0.0
    fixed = my - slope * mx
    if fixed < 0:
        return 0.0, max(0.0, sum(seconds) / sum(sizes))
    return fixed, slope


def ActionCosts(
    sched: Schedule,
    counts: Sequence[int],
    times: CellTimes,
    micro_batch: float,
    action_s: float,
    remat: remat_lib.Remat,
    transfer: Callable[[int], float] | None = None,
    sum_s: Sequence[float] | None = None,
    contention: float = 1.0,
    contended: bool = True,
    lockstep: bool = False,
    no_input_gradient: Sequence[int] = (),
) -> dict[str, dict[tuple[int, int], float]]:
    """Per kind, {(stage, micro-batch): seconds} of every action of `sched` (module doc).

    Args:
      sched: the schedule; counts: cells per stage of it.
      times: the cells' times; micro_batch: examples per micro-batch.
      action_s: the fixed cost of one action.
      remat: the recompute policy (one, or one per stage).
      transfer: seconds to move the outputs of cell c (for one micro-batch) to
        another device; None: free.
      sum_s: per stage, seconds to add one micro-batch's weight gradients to the
        stage's sum (paid by each W, or B); None: free.
      contention: the device's factor on every time but `action_s` and the transfers
        (1: uncontended).
      contended: whether another device computes beside each action; if not, a B
        action's gradients take times.BackwardAlone.
      lockstep: every device runs the same actions at the same time (replicas): a stage
        whose cells were profiled beside a copy of themselves (times.forward_together)
        takes their own factor at the micro-batch's size (CellTimes.Contention) in
        place of `contention`.
      no_input_gradient: cells whose inputs' gradient no step computes (the first
        stage's up to its first cell with weights, FirstStageWithoutInputGradient):
        their I costs nothing, and their B only the weights' gradient (W).
    """
    bounds = partition.Boundaries(list(counts))
    if len(bounds) != sched.num_stages:
        raise ValueError(
            f"cost model: expected one cell count per stage of schedule {sched.name!r} "
            f"({sched.num_stages}), received {list(counts)}"
        )
    kept = remat_lib.Kept(sched, remat) if sched.has_backward else set()
    out: dict[str, dict] = {k: {} for k in (FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT)}
    for s, (lo, hi) in enumerate(bounds):
        cells = range(lo, hi)
        factor = contention
        if contended and lockstep:
            factor = times.Contention(cells, micro_batch, contention)
        # Both gradients where the inputs' gradient is needed, the weights' alone where not;
        # a cell whose inputs have none (token ids: I is 0) was profiled so already.
        full = [
            c
            for c in cells
            if c not in no_input_gradient or not times.Seconds(BACKWARD_INPUT, [c], micro_batch)
        ]
        weights_only = factor * times.Seconds(BACKWARD_WEIGHT, [c for c in cells if c not in full],
                                              micro_batch)  # fmt: skip
        f, w = (factor * times.Seconds(k, cells, micro_batch) for k in "FW")
        i = factor * times.Seconds(BACKWARD_INPUT, full, micro_batch)
        both = factor * times.BackwardAlone(full, micro_batch) + weights_only
        if contended:
            together = times.BackwardTogether(full, micro_batch)
            if together is None:
                both = i + w
            else:
                both = together + weights_only
        summed = contention * (sum_s[s] if sum_s is not None else 0.0)
        w += summed
        move_in = move_back = 0.0
        if transfer is not None and s > 0 and sched.DeviceOf(s - 1) != sched.DeviceOf(s):
            move_in = transfer(lo - 1)
        last = sched.num_stages - 1
        if transfer is not None and s < last and sched.DeviceOf(s + 1) != sched.DeviceOf(s):
            move_back = transfer(hi - 1)
        for m in range(sched.num_micro_batches):
            replay = 0.0 if (s, m) in kept else f
            out[FORWARD][(s, m)] = f + action_s + move_in
            out[BACKWARD_INPUT][(s, m)] = i + replay + action_s + move_back
            out[BACKWARD_WEIGHT][(s, m)] = w + action_s
            out[BACKWARD][(s, m)] = both + summed + replay + action_s + move_back
    return out


def OptimizerSeconds(
    device_weight_bytes: Sequence[float],
    apply_s_per_byte: float,
    device_weights: Sequence[int] = (),
    apply_s_per_weight: float = 0.0,
) -> float:
    """The optimizer's apply (or any pass over the weights at `apply_s_per_byte`, and
    `apply_s_per_weight` per variable): each device its own weights, in parallel."""
    number = list(device_weights) or [0] * len(device_weight_bytes)
    per_device = [
        b * apply_s_per_byte + n * apply_s_per_weight for b, n in zip(device_weight_bytes, number)
    ]
    return max(per_device, default=0.0)
