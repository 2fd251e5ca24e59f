"""V-Half and V-Min: schedules on the V placement that hold less activation memory.

    sched = ControllableMemory('v_min', num_devices=4, num_micro_batches=8)  # 8 stages

From Qi, Wan, Huang and Lin, "Pipeline Parallelism with Controllable Memory" (NeurIPS
2024). A schedule there is one building block repeated: for a single micro-batch, the
time slot of each of its actions on each device. The memory a device holds is set by
the block's lifespans (a stage's forward to its weight gradient): repeated every
`_PERIOD` slots, a lifespan of L slots keeps about L / _PERIOD micro-batches alive.

Device d runs stages d (its first) and 2K-1-d (its second). Every action takes one
slot; a micro-batch costs a device six (F, I and W of two stages), so the block
repeats every six slots. The blocks' slots of F first, F second, I second, I first
for micro-batch 0 on device d (g keeps the four apart modulo six):

    v_min:  d,   2K-1-d,  2K+g+d,      4K+g-1-d    (g = 2 if K % 3 == 0 else 0)
    v_half: 2d,  3K-2-d,  3K-1+g+2d,   6K-2+g-d    (g = 3 if K % 2 == 0 else 0)

The first stage lives about 4K (V-Min) or 6K (V-Half) slots on device 0, against
1F1B's about 6K half-size slots (3K of its own): a third or a half of 1F1B's
activations once K is large; each device also holds its second stage's one or two.
Simulated, a device's peak is 2 (K // 2 + 1) (V-Half) and 2 ((K + 1) // 3 + 1)
(V-Min) (stage, micro-batch) pairs once M >= 2K, fewer below; each pair holds half a
1F1B stage's activations, so that is K // 2 + 1 and (K + 1) // 3 + 1 of 1F1B's K.

The repeated blocks leave the warm-up and cool-down with holes; as in the paper's
published code (a greedy pass), they are squeezed: taken in the order of their
slots, each action of the warm-up or cool-down moves to the earliest free slot after
what it waits for where its device's peak stays at most the steady state's. The
steady state is kept as the block has it (with its W's it has no free slot). The
cool-down is squeezed again without the W's, so that its I's come first and the W's
fill the slots left free; each device's list is its actions in slot order.
"""

from __future__ import annotations

import itertools

from lingpipe.pipeline.schedules.schedule import (
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    Action,
    Schedule,
    ScheduleError,
)

__all__ = [
    "ControllableMemory",
    "NAMES",
]

NAMES = ("v_half", "v_min")
_PERIOD = 6  # slots of a micro-batch on a device: F, I and W of each of its two stages


def _Block(name: str, num_devices: int) -> list[dict[Action, int]]:
    """Per device, the slot of each F and I of micro-batch 0 (`name` in NAMES)."""
    k = num_devices
    devices = []
    for d in range(k):
        if name == "v_min":
            g = 2 if k % 3 == 0 else 0
            slots = (d, 2 * k - 1 - d, 2 * k + g + d, 4 * k + g - 1 - d)
        else:
            g = 3 if k % 2 == 0 else 0
            slots = (2 * d, 3 * k - 2 - d, 3 * k - 1 + g + 2 * d, 6 * k - 2 + g - d)
        first, second = d, 2 * k - 1 - d
        acts = [(FORWARD, first), (FORWARD, second), (BACKWARD_INPUT, second)]
        acts.append((BACKWARD_INPUT, first))
        devices.append({Action(kind, st, 0): t for (kind, st), t in zip(acts, slots)})
    return devices


def ControllableMemory(name: str, num_devices: int, num_micro_batches: int) -> Schedule:
    """The schedule `name` ('v_half' or 'v_min') for K devices (2K stages on the V) and M
    micro-batches: the block repeated every six slots, squeezed, W's in the free slots.

    Raises:
      ScheduleError: a name not in NAMES.
    """
    if name not in NAMES:
        raise ScheduleError(f"schedule: expected one of {', '.join(NAMES)}, received {name!r}")
    k, m = num_devices, num_micro_batches
    plans = [
        {a._replace(micro_batch=mb): t + _PERIOD * mb for a, t in block.items() for mb in range(m)}
        for block in _Block(name, k)
    ]
    # The steady state, kept as the block has it: from device 0's first I of its first
    # stage (micro-batch 0 done with the V) to its last forward.
    steady = (plans[0][Action(BACKWARD_INPUT, 0, 0)], plans[0][Action(FORWARD, 0, m - 1)])
    plans = [_PlaceW(plan) for plan in plans]
    _Squeeze(plans, steady, warm_up=True)
    plans = [{a: t for a, t in plan.items() if a.kind != BACKWARD_WEIGHT} for plan in plans]
    _Squeeze(plans, steady, warm_up=False)
    plans = [_PlaceW(plan, second_first=2 * k - 1 - d) for d, plan in enumerate(plans)]
    devices = [sorted(plan, key=plan.get) for plan in plans]
    placement = tuple(range(k)) + tuple(reversed(range(k)))  # generators.VPlacement
    return Schedule(name, k, 2 * k, m, devices, placement)


def _PlaceW(plan: dict[Action, int], second_first: int | None = None) -> dict[Action, int]:
    """`plan` (F's and I's) with each W in a free slot after its I: each free slot takes
    the oldest W owed, or, given `second_first` (the device's second stage), the oldest
    of that stage's first (the paper's order). Those left go after the last slot."""
    owed, out, end = [], dict(plan), max(plan.values())
    taken = {t: a for a, t in plan.items()}
    for t in itertools.count():
        if t > end and not owed:
            return out
        if t in taken:
            if taken[t].kind == BACKWARD_INPUT:
                owed.append(taken[t]._replace(kind=BACKWARD_WEIGHT))
        elif owed:
            pick = next((w for w in owed if w.stage == second_first), owed[0])
            owed.remove(pick)
            out[pick] = t


def _Peak(plan: dict[Action, int]) -> int:
    """The most micro-batches alive on a device at once under `plan`: F's less W's, in
    slot order; without W's listed, each free slot pays one owed (as _PlaceW will)."""
    taken = {t: a.kind for a, t in plan.items()}
    has_w = BACKWARD_WEIGHT in taken.values()
    alive = owed = peak = 0
    for t in range(max(taken) + 1):
        kind = taken.get(t)
        alive += {FORWARD: 1, BACKWARD_WEIGHT: -1}.get(kind, 0)
        owed += kind == BACKWARD_INPUT
        if kind is None and not has_w and owed:
            alive, owed = alive - 1, owed - 1
        peak = max(peak, alive)
    return peak


def _Needs(a: Action, num_stages: int) -> list[Action]:
    """What `a` waits for, its own kind's previous micro-batch of the stage included
    (so that each stage keeps its micro-batches in order)."""
    needs = [a._replace(micro_batch=a.micro_batch - 1)] if a.micro_batch else []
    if a.kind == FORWARD and a.stage > 0:
        needs.append(a._replace(stage=a.stage - 1))
    elif a.kind == BACKWARD_INPUT:
        needs.append(a._replace(kind=FORWARD))
        if a.stage < num_stages - 1:
            needs.append(a._replace(stage=a.stage + 1))
    elif a.kind == BACKWARD_WEIGHT:
        needs.append(a._replace(kind=BACKWARD_INPUT))
    return needs


def _Squeeze(plans: list[dict[Action, int]], steady: tuple[int, int], warm_up: bool) -> None:
    """Moves, in slot order, each action of the cool-down (after `steady`) and, if
    `warm_up`, of the warm-up (before it) to the earliest free slot after what it waits
    for where its device's peak stays at most the plans' peak now."""
    k = len(plans)
    cap = max(_Peak(plan) for plan in plans)
    device = {a: d for d, plan in enumerate(plans) for a in plan}
    slot = {a: t for plan in plans for a, t in plan.items()}
    taken = [set(plan.values()) for plan in plans]
    for a in sorted(slot, key=lambda a: (slot[a], device[a])):
        if steady[0] <= slot[a] <= steady[1] or (slot[a] < steady[0] and not warm_up):
            continue
        plan, was = plans[device[a]], slot[a]
        earliest = 1 + max((slot[x] for x in _Needs(a, 2 * k) if x in slot), default=-1)
        for t in range(earliest, was):
            if t in taken[device[a]]:
                continue
            plan[a] = t
            if _Peak(plan) <= cap:
                break
            plan[a] = was
        taken[device[a]].discard(was)
        taken[device[a]].add(plan[a])
        slot[a] = plan[a]
