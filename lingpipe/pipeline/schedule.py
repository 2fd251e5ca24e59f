"""The GPipe fill-drain schedule.

At clock tick t, stage k works on micro-batch t - k: stage 0 fills the pipeline
with micro-batches 0..M-1 in order and every later stage follows one tick behind.
`PipeliningLayer` issues its stage calls in this order and ties each stage's
forwards into a chain (micro-batch m+1 after m on the same stage), so the
dataflow lets stage k run micro-batch m+1 while stage k+1 runs micro-batch m.

In backward each stage differentiates one micro-batch at a time, in the order
the tape builds the gradients (stage_call.GradientAccumulator chains them; the
tape builds micro-batch 0 first). `BackwardTicks` is the paper's mirrored
order, kept as the reference model of the schedule; the engine does not force it.
"""

from __future__ import annotations


def FillDrain(num_stages: int, num_micro_batches: int) -> list[list[tuple[int, int]]]:
    """Forward clock ticks: ticks[t] lists the (stage, micro_batch) pairs that run at t."""
    ticks = []
    for t in range(num_stages + num_micro_batches - 1):
        ticks.append([(k, t - k) for k in range(num_stages) if 0 <= t - k < num_micro_batches])
    return ticks


def BackwardTicks(num_stages: int, num_micro_batches: int) -> list[list[tuple[int, int]]]:
    """The backward's ticks: the forward's mirrored, last stage and last micro-batch first."""
    return [
        sorted(tick, key=lambda km: (-km[0], -km[1]))
        for tick in reversed(FillDrain(num_stages, num_micro_batches))
    ]


def BubbleFraction(num_stages: int, num_micro_batches: int) -> float:
    """Idle share of the pipeline, (K - 1) / (M + K - 1), as in the GPipe paper."""
    return (num_stages - 1) / (num_micro_batches + num_stages - 1)
