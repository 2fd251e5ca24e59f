"""Which forwards keep their activations for the backward; the executor replays the others."""

from __future__ import annotations

from lingpipe.pipeline.schedule import BACKWARD, BACKWARD_INPUT, FORWARD, Schedule

POLICIES = ("always", "except_last", "never")


def Kept(sched: Schedule, policy: str) -> set[tuple[int, int]]:
    """The (stage, micro-batch) pairs whose activations are kept under `policy`.

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
    if not sched.has_backward:
        return set()
    pairs = {(s, m) for s in range(sched.num_stages) for m in range(sched.num_micro_batches)}
    if policy != "except_last":
        return pairs if policy == "never" else set()
    kept = set()
    for acts in sched.device_actions:
        where = {a: i for i, a in enumerate(acts)}  # an Action equals its (kind, stage, mb)
        backs = [i for i, a in enumerate(acts) if a.kind in (BACKWARD, BACKWARD_INPUT)]
        for stage in {a.stage for a in acts}:
            gaps = []
            for m in range(sched.num_micro_batches):
                fwd = where[(FORWARD, stage, m)]
                back = where.get((BACKWARD, stage, m), where.get((BACKWARD_INPUT, stage, m)))
                if not any(fwd < i < back for i in backs):
                    gaps.append((back - fwd, -m))
            if gaps:
                kept.add((stage, -min(gaps)[1]))
    return kept
