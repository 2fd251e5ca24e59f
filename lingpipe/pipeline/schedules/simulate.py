"""Simulating a schedule: validation, makespan, bubble, alive micro-batches, the grid.

Each device runs its actions in order; an action starts when its device is free
and the actions it needs are done:

    F s m   needs F s-1 m                   (the previous stage's output)
    B s m   needs F s m and B s+1 m         (its forward; the gradient of its output)
    I s m   as B
    W s m   needs I s m

`Simulate` rejects a schedule that is malformed (an action on a device that does not hold
its stage, a micro-batch run twice or never) or that can deadlock, in one line naming each
device's next action, what it waits for, and where that is (blocked, or listed later).
A forward-only schedule (no B, I or W at all) is valid: evaluation runs one. Costs are
per kind, in time units: by default 1 for F, I and W, and 2 for a whole backward B;
or per stage, or per action (lingpipe.pipeline.planning.cost_model gives them in seconds).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools

from lingpipe.pipeline.schedules.actions import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    KINDS,
    Action,
    Schedule,
    ScheduleError,
)

__all__ = [
    "DEFAULT_COSTS",
    "Dependencies",
    "Figures",
    "Grid",
    "LastAction",
    "PeakOf",
    "Simulate",
    "Simulation",
]

DEFAULT_COSTS = {FORWARD: 1.0, BACKWARD: 2.0, BACKWARD_INPUT: 1.0, BACKWARD_WEIGHT: 1.0}


@dataclasses.dataclass
class Simulation:
    """When each action runs, and what that gives.

    Attributes:
      start, end: {action: time}.
      makespan: the end of the last action.
      idle_share: per device, the share of the makespan it waits.
      peak_alive: per stage, the most micro-batches whose forward has started and
        whose backward (W for zero bubble; the forward itself when there is no
        backward) has not ended, at any time.
      device_peak_alive: per device, the most (stage, micro-batch) pairs alive at
        once over all of its stages.
      order: every action in the order it starts (ties: by device), a valid order
        to create them in.
    """

    start: dict[Action, float]
    end: dict[Action, float]
    makespan: float
    idle_share: list[float]
    peak_alive: list[int]
    order: list[Action]
    device_peak_alive: list[int] = dataclasses.field(default_factory=list)

    @property
    def bubble(self) -> float:
        """The mean idle share over the devices."""
        return sum(self.idle_share) / len(self.idle_share)


def _CheckStructure(s: Schedule) -> None:
    """Every action on its stage's device; per stage and micro-batch one F and one B
    (or one I and one W), or, in a forward-only schedule, one F."""
    for d, acts in enumerate(s.device_actions):
        for a in acts:
            expected = ""
            if a.kind not in KINDS or not 0 <= a.stage < s.num_stages:
                expected = f"a kind in {KINDS} and a stage in 0..{s.num_stages - 1}"
            elif not 0 <= a.micro_batch < s.num_micro_batches:
                expected = f"a micro-batch in 0..{s.num_micro_batches - 1}"
            if expected:
                raise ScheduleError(f"schedule {s.name!r}: device {d} has {a}, expected {expected}")
            if s.DeviceOf(a.stage) != d:
                raise ScheduleError(
                    f"schedule {s.name!r}: {a} is listed on device {d}, but stage {a.stage} "
                    f"lives on device {s.DeviceOf(a.stage)}"
                )
    seen = collections.Counter(a for acts in s.device_actions for a in acts)
    # How often F, B, I and W of a stage and micro-batch may be listed.
    allowed = {(1, 1, 0, 0), (1, 0, 1, 1)} if s.has_backward else {(1, 0, 0, 0)}
    for stage, m in itertools.product(range(s.num_stages), range(s.num_micro_batches)):
        acts = [Action(kind, stage, m) for kind in KINDS]
        if tuple(seen[x] for x in acts) not in allowed:
            counts = ", ".join(f"{x}: {seen[x]}" for x in acts)
            raise ScheduleError(
                f"schedule {s.name!r}: stage {stage} micro-batch {m} needs one F and one "
                f"B (or one I and one W), received {counts}"
            )


def Dependencies(s: Schedule, a: Action, listed: set[Action]) -> list[Action]:
    """The actions `a` waits for; `listed`, every action of `s`, says whether the next
    stage's backward is a B or an I."""
    if a.kind == FORWARD:
        return [Action(FORWARD, a.stage - 1, a.micro_batch)] if a.stage > 0 else []
    if a.kind == BACKWARD_WEIGHT:
        return [Action(BACKWARD_INPUT, a.stage, a.micro_batch)]
    deps = [Action(FORWARD, a.stage, a.micro_batch)]
    if a.stage < s.num_stages - 1:
        nxt = Action(BACKWARD, a.stage + 1, a.micro_batch)
        deps.append(nxt if nxt in listed else nxt._replace(kind=BACKWARD_INPUT))
    return deps


def _Cost(costs: dict, a: Action) -> float:
    cost = costs[a.kind]
    if isinstance(cost, dict):
        return cost[(a.stage, a.micro_batch)]
    return cost[a.stage] if isinstance(cost, (list, tuple)) else cost


def Simulate(s: Schedule, costs: dict[str, float | list] | None = None) -> Simulation:
    """Runs `s` in simulated time; raises ScheduleError for what the module doc rejects.
    `costs` per kind: a number, one per stage, or {(stage, micro-batch): cost} (the
    planner's: lingpipe.pipeline.planning.cost_model.ActionCosts)."""
    _CheckStructure(s)
    costs = dict(DEFAULT_COSTS, **(costs or {}))
    listed = {a for acts in s.device_actions for a in acts}
    start: dict[Action, float] = {}
    end: dict[Action, float] = {}
    free = [0.0] * s.num_devices
    heads = [0] * s.num_devices
    while len(end) < len(listed):  # _CheckStructure: no action is listed twice
        ran = len(end)
        for d, acts in enumerate(s.device_actions):
            while heads[d] < len(acts):
                a = acts[heads[d]]
                deps = Dependencies(s, a, listed)
                if any(x not in end for x in deps):
                    break
                start[a] = max([free[d]] + [end[x] for x in deps])
                end[a] = free[d] = start[a] + _Cost(costs, a)
                heads[d] += 1
        if len(end) == ran:  # nothing ran: every unfinished device waits
            raise ScheduleError(_Deadlock(s, heads, end, len(listed)))
    makespan = max(end.values(), default=0.0)
    busy = [sum(_Cost(costs, a) for a in acts) for acts in s.device_actions]
    idle = [1.0 - b / makespan if makespan else 0.0 for b in busy]
    order = sorted(start, key=lambda a: (start[a], s.DeviceOf(a.stage)))  # stable: ties as run
    peaks, device_peaks = _PeakAlive(s, start, end)
    return Simulation(start, end, makespan, idle, peaks, order, device_peaks)


def _Deadlock(s: Schedule, heads: list[int], end: dict[Action, float], total: int) -> str:
    """One line: each device's next action, what it waits for and where that is."""
    blocked = []
    for d, acts in enumerate(s.device_actions):
        if heads[d] == len(acts):
            continue
        a = acts[heads[d]]
        waits = []
        for x in Dependencies(s, a, set(itertools.chain(*s.device_actions))):
            if x in end:
                continue
            e = s.DeviceOf(x.stage)
            position = s.device_actions[e].index(x)  # _CheckStructure: x is listed once
            if position == heads[e]:
                where = f"blocked, next on device {e}"
            else:
                where = "listed after it" if e == d else f"listed later on device {e}"
            waits.append(f"{x} ({where})")
        blocked.append(f"device {d}'s next action {a} waits for {', '.join(waits)}")
    return (
        f"schedule {s.name!r} deadlocks after {len(end)} of {total} actions: "
        + "; ".join(blocked)
        + "; expected each action after those it waits for"
    )


def LastAction(stage: int, m: int, end: dict) -> Action:
    """The action that ends micro-batch m's life on `stage`: its B, W, or (forward only) F."""
    for kind in (BACKWARD, BACKWARD_WEIGHT):
        if Action(kind, stage, m) in end:
            return Action(kind, stage, m)
    return Action(FORWARD, stage, m)


def PeakOf(events: list[tuple[float, int]]) -> int:
    """The largest running sum of `events` ((time, delta); at a tie, frees first: sorted
    puts the negative delta first), 0 for none."""
    return max(itertools.accumulate((delta for _, delta in sorted(events)), initial=0))


def _PeakAlive(s: Schedule, start: dict, end: dict) -> tuple[list[int], list[int]]:
    """(per stage, per device) the most micro-batches alive at once."""
    events = [  # PeakOf sorts them
        [(start[Action(FORWARD, stage, m)], 1) for m in range(s.num_micro_batches)]
        + [(end[LastAction(stage, m, end)], -1) for m in range(s.num_micro_batches)]
        for stage in range(s.num_stages)
    ]
    device = [sum((events[st] for st in s.StagesOf(d)), []) for d in range(s.num_devices)]
    return [PeakOf(e) for e in events], [PeakOf(e) for e in device]


def Grid(s: Schedule, sim: Simulation) -> str:
    """One row per device, one column per time unit: `F3` forward of micro-batch 3 (as
    Schedule.Label writes it), `~` the rest of a longer action, `.` idle."""
    width = max([len(a.kind + s.Label(a)) for acts in s.device_actions for a in acts] + [2])
    slots = round(sim.makespan)
    rows = [["."] * slots for _ in range(s.num_devices)]
    for a in sim.start:
        t0, t1 = round(sim.start[a]), round(sim.end[a])
        for t in range(t0, min(t1, slots)):
            rows[s.DeviceOf(a.stage)][t] = a.kind + s.Label(a) if t == t0 else "~"
    lines = ["      " + " ".join(f"{t:>{width}}" for t in range(slots))]
    lines += [f"dev {d:<2}" + " ".join(f"{c:>{width}}" for c in row) for d, row in enumerate(rows)]
    return "\n".join(lines)


def Figures(s: Schedule, sim: Simulation, costs: str = "F=1, I=W=1, B=2") -> str:
    """The makespan, the bubble, and per device its idle share and its peak alive
    micro-batches (all its stages together, then per stage)."""
    lines = [
        f"schedule {s.name}: K={s.num_devices} devices, {s.num_stages} stages, "
        f"M={s.num_micro_batches} micro-batches",
        f"makespan {sim.makespan:g} time units ({costs}); bubble {sim.bubble:.1%}",
    ]
    for d in range(s.num_devices):
        peaks = ", ".join(f"s{st}: {sim.peak_alive[st]}" for st in s.StagesOf(d))
        lines.append(
            f"  device {d}: idle {sim.idle_share[d]:.1%}; peak alive micro-batches "
            f"{sim.device_peak_alive[d]} ({peaks})"
        )
    return "\n".join(lines)
