"""Which forwards keep their activations for the backward; the executor replays the others.

`remat` is one policy for every stage, or a list with one policy per stage of the
schedule (recompute on the first stages only, say, which hold the most micro-batches
under 1F1B: `['always', 'always', 'never', 'never']`).
"""

from __future__ import annotations

from collections.abc import Sequence

from lingpipe.pipeline.schedules.schedule import BACKWARD, BACKWARD_INPUT, FORWARD, Schedule

__all__ = [
    "Kept",
    "POLICIES",
    "PerStage",
    "Remat",
    "Text",
]

POLICIES = ("always", "except_last", "never")

Remat = str | Sequence[str]  # a policy, or one per stage


def PerStage(remat: Remat, num_stages: int, where: str | None = None) -> tuple[str, ...]:
    """`remat` as one policy per stage: a policy of POLICIES for all `num_stages` stages,
    or a list (or tuple) of `num_stages` of them.

    Raises:
      ValueError: an unknown policy, or a list whose length is not `num_stages`; the
        message leads with `where` (a layer's path).
    """
    if isinstance(remat, str):
        per_stage = (remat,) * num_stages
    elif isinstance(remat, (list, tuple)) and len(remat) == num_stages:
        per_stage = tuple(remat)
    else:
        per_stage = (None,)
    if all(isinstance(r, str) and r in POLICIES for r in per_stage):
        return per_stage
    stages = f"{num_stages} stage{'' if num_stages == 1 else 's'}"
    message = (
        f"expected remat to be one of {', '.join(POLICIES)} or a list of them with one per "
        f"stage ({stages}), received remat={remat!r}"
    )
    raise ValueError(f"{where}: {message}" if where else message)


def Text(remat: Remat) -> str:
    """`remat` in a note: 'always', or '[always, always, never, never]' per stage."""
    return remat if isinstance(remat, str) else f"[{', '.join(map(str, remat))}]"


def Kept(sched: Schedule, remat: Remat) -> set[tuple[int, int]]:
    """The (stage, micro-batch) pairs whose activations are kept, each stage under its
    policy of `remat` (one for every stage, or one per stage: PerStage).

    'never' (recompute never) keeps all, 'always' none; 'except_last' keeps, per
    stage, the micro-batch whose backward follows its forward most closely on the
    device (the latest one on a tie), provided no other backward runs on the device
    in between: that backward would replay its own forward while the kept
    activations are still held, two micro-batches' activations at once, more than
    'always' ever holds. Under GPipe every stage keeps its last micro-batch; under
    1F1B the last stage keeps its last (forward and backward adjacent) and the
    others their first (only forwards run before its backward). A forward-only
    schedule keeps nothing: no backward will read it.
    """
    policies = PerStage(remat, sched.num_stages)
    if not sched.has_backward:
        return set()
    micro_batches = range(sched.num_micro_batches)
    kept = {(s, m) for s, p in enumerate(policies) if p == "never" for m in micro_batches}
    for acts in sched.device_actions:
        where = {a: i for i, a in enumerate(acts)}  # an Action equals its (kind, stage, mb)
        backs = [i for i, a in enumerate(acts) if a.kind in (BACKWARD, BACKWARD_INPUT)]
        for stage in {a.stage for a in acts}:
            if policies[stage] != "except_last":
                continue
            gaps = []
            for m in micro_batches:
                fwd = where[(FORWARD, stage, m)]
                back = where.get((BACKWARD, stage, m), where.get((BACKWARD_INPUT, stage, m)))
                if not any(fwd < i < back for i in backs):
                    gaps.append((back - fwd, -m))
            if gaps:
                kept.add((stage, -min(gaps)[1]))
    return kept
