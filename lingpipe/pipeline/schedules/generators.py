"""The schedules by name, and what `p.schedule` may be: a name, a Schedule, a CSV file.

    sched = generators.Make('zbv', num_stages=4, num_micro_batches=8)  # K=4 devices, 8 stages
    sched = generators.Resolve('my_schedule.csv', num_devices=4, num_micro_batches=8)

Every schedule Make returns has been run by lingpipe.pipeline.schedules.simulate, so one
that breaks a dependency or would deadlock never reaches the executor.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable

from lingpipe.pipeline.schedules import controllable_memory, simulate
from lingpipe.pipeline.schedules.schedule import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    Action,
    FromCsvFile,
    Schedule,
    ScheduleError,
)

__all__ = [
    "BreadthFirst",
    "DualPipeV",
    "IsCsvPath",
    "Make",
    "OneForwardOneBackward",
    "Resolve",
    "SCHEDULES",
    "VIRTUAL",
    "VPlacement",
    "V_SHAPED",
    "ZBV",
]

# Names that take num_virtual_stages v > 1 (loop placement); V-shaped ones always have 2.
VIRTUAL = ("interleaved_1f1b", "looped_bfs", "interleaved_zero_bubble", "forward_only")
V_SHAPED = ("zbv", "dualpipev", *controllable_memory.NAMES)


def VPlacement(num_devices: int) -> tuple[int, ...]:
    """The V placement of 2K stages: stage s on device s for s < K, else 2K-1-s."""
    return tuple(range(num_devices)) + tuple(reversed(range(num_devices)))


class _Device:
    """A device's list being written: per stage, the next micro-batch of each kind,
    and the W's owed, oldest first."""

    def __init__(self, m: int) -> None:
        self.acts: list[Action] = []
        self.next: dict[tuple[str, int], int] = {}
        self.owed: list[Action] = []
        self.m = m

    def Add(self, kind: str, stage: int) -> None:
        """The next `kind` of `stage` (B: its whole backward; I owes a W)."""
        key = (BACKWARD_INPUT if kind == BACKWARD else kind, stage)
        mb = self.next.get(key, 0)
        self.next[key] = mb + 1
        if mb < self.m:  # generators may overrun M; what is past it is no work
            self.acts.append(Action(kind, stage, mb))
            if kind == BACKWARD_INPUT:
                self.owed.append(Action(BACKWARD_WEIGHT, stage, mb))

    def PayW(self, count: int = 1) -> None:
        """The oldest `count` W's owed (fewer if fewer are owed)."""
        for _ in range(min(count, len(self.owed))):
            self.acts.append(self.owed.pop(0))


def BreadthFirst(
    name: str,
    num_devices: int,
    num_micro_batches: int,
    num_virtual_stages: int = 1,
    placement: tuple[int, ...] | None = None,
) -> Schedule:
    """Every micro-batch through a device's first stage, then its second, ... (placement:
    stage_devices, default the loop one of K * v stages), then the backwards, last stage
    and last micro-batch first: `gpipe` (v = 1, the fill-drain), `looped_bfs`, and
    `forward_only` (no backwards: evaluation). All M micro-batches stay alive."""
    k, m, v = num_devices, num_micro_batches, num_virtual_stages
    placement = placement or tuple(s % k for s in range(k * v))
    devices = []
    for d in range(k):
        stages = [s for s, where in enumerate(placement) if where == d]
        acts = [Action(FORWARD, s, mb) for s in stages for mb in range(m)]
        if name != "forward_only":
            acts += [Action(BACKWARD, s, mb) for s in stages[::-1] for mb in reversed(range(m))]
        devices.append(acts)
    return Schedule(name, k, len(placement), m, devices, placement)


def OneForwardOneBackward(
    name: str, num_devices: int, num_micro_batches: int, num_virtual_stages: int = 1
) -> Schedule:
    """The 1F1B family on the loop placement: a warm-up of forwards, then one forward
    and one backward at a time, then the remaining backwards; with v chunks per device
    the micro-batches go through them in rounds (Megatron's interleaving, for any M).

    - `1f1b` (v = 1; PipeDream-flush): warm-up K-d-1; device d holds at most K-d.
    - `interleaved_1f1b`: warm-up 2 (K-d-1) + (v-1) R, R the first round's size.
    - `zero_bubble` (ZB-H1, Qi et al. 2024) and `interleaved_zero_bubble` (ZB1P): the
      backward split into I and W, warm-up (v-1) R + K-d-1, each W paid d I's behind
      its own so the W's fill what would be bubbles; at most K micro-batches per chunk
      alive. Bubble under F = I = W = 1: (K-1) / (3M + K-1) for v = 1.
    """
    k, m, v = num_devices, num_micro_batches, num_virtual_stages
    split = "zero_bubble" in name
    # Each forward's and backward's chunk, in Megatron's order: M // K rounds of K or more
    # micro-batches (sizes as even as can be), each through every chunk (backwards: last
    # first). A round of at least K keeps chunk c+1's first forward from waiting on the fill.
    rounds = max(1, m // k)
    sizes = [m // rounds + (1 if i < m % rounds else 0) for i in range(rounds)]
    forwards = [c for size in sizes for c in range(v) for _ in range(size)]
    backwards = [v - 1 - c for c in forwards]
    devices = []
    for d in range(k):
        dev = _Device(m)
        warmup = (v - 1) * sizes[0] + (k - d - 1) * (2 if v > 1 and not split else 1)
        warmup = min(warmup, len(forwards))
        for i in range(len(forwards) + warmup):
            if i < len(forwards):
                dev.Add(FORWARD, forwards[i] * k + d)
            if i >= warmup:
                dev.Add(BACKWARD_INPUT if split else BACKWARD, backwards[i - warmup] * k + d)
                if i - warmup >= d:
                    dev.PayW()
        dev.PayW(len(dev.owed))
        devices.append(dev.acts)
    return Schedule(name, k, k * v, m, devices)


def ZBV(num_devices: int, num_micro_batches: int) -> Schedule:
    """ZB-V (Qi et al., 2024, section 6): zero bubble on the V placement, device d
    running stages d and 2K-1-d. Warms up with 2(K-d)-1 forwards of its first stage,
    d pairs of forwards (second stage, first), K-d rounds of F, I, W of its second
    stage; then both stages' F, I, W in turn; the cool-down runs the I's first and
    the W's after. Activation memory is 1F1B's; the bubble shrinks as ZB-H1's does."""
    k, m = num_devices, num_micro_batches
    devices = []
    for d in range(k):
        first, second = d, 2 * k - 1 - d
        dev, n = _Device(m), max(2 * k - 1, m)
        for _ in range(2 * (k - d) - 1):
            dev.Add(FORWARD, first)
        for _ in range(d):
            dev.Add(FORWARD, second), dev.Add(FORWARD, first)
        for _ in range(k - d):
            dev.Add(FORWARD, second), dev.Add(BACKWARD_INPUT, second), dev.PayW()
        # Until the first stage has n forwards and the second caught up (never ahead).
        while dev.next[(FORWARD, second)] < max(dev.next[(FORWARD, first)], n):
            if dev.next[(FORWARD, first)] < n:
                dev.Add(FORWARD, first)
            dev.Add(BACKWARD_INPUT, first), dev.PayW()
            dev.Add(FORWARD, second), dev.Add(BACKWARD_INPUT, second), dev.PayW()
        for _ in range(d):
            dev.Add(BACKWARD_INPUT, first), dev.Add(BACKWARD_INPUT, second)
        for _ in range(k - d):
            dev.Add(BACKWARD_INPUT, first)
            dev.owed.sort(key=lambda a: a.stage != first)  # the first stage's W's go first
            dev.PayW()
        dev.owed.sort(key=lambda a: (a.stage == first, a.micro_batch))
        dev.PayW(len(dev.owed))
        devices.append(dev.acts)
    return Schedule("zbv", k, 2 * k, m, devices, VPlacement(k))


def DualPipeV(num_devices: int, num_micro_batches: int) -> Schedule:
    """DeepSeek's DualPipeV (the V-shaped DualPipe, DeepSeek-V3 report): device d runs
    stages d and 2K-1-d. Warm-up forwards of the first stage, pairs of forwards, then
    the main phase: forward of one stage beside the backward of the other (DualPipe
    overlaps the two; here they run one after the other on the device), whole
    backwards B while the W's cannot fill a bubble, I and deferred W's where they can.
    Needs M >= 2K."""
    k, m = num_devices, num_micro_batches
    if m < 2 * k:
        raise ScheduleError(
            f"schedule 'dualpipev': expected num_micro_batches >= 2 * num_stages = {2 * k} "
            f"(its warm-up fills both stages of every device); received num_micro_batches={m}"
        )
    devices = []
    for d in range(k):
        first, second, dev = d, 2 * k - 1 - d, _Device(m)
        for _ in range(2 * (k - d - 1)):
            dev.Add(FORWARD, first)
        for _ in range(d + 1):
            dev.Add(FORWARD, first), dev.Add(FORWARD, second)
        for _ in range(k - d - 1):
            dev.Add(BACKWARD_INPUT, second), dev.PayW(), dev.Add(FORWARD, second)
        for _ in range(m - 2 * k + d + 1):
            dev.Add(FORWARD, first), dev.Add(BACKWARD, second)
            dev.Add(FORWARD, second), dev.Add(BACKWARD, first)
        for _ in range(k - d - 1):
            dev.Add(BACKWARD, second), dev.Add(FORWARD, second), dev.Add(BACKWARD, first)
        for i in range(2 * (d + 1)):  # second, first, ...; the second half leave their W's
            dev.Add(BACKWARD_INPUT if i > d else BACKWARD, first if i % 2 else second)
        for _ in range(k - d - 1):
            dev.PayW(), dev.Add(BACKWARD_INPUT, first)
        dev.PayW(len(dev.owed))
        devices.append(dev.acts)
    return Schedule("dualpipev", k, 2 * k, m, devices, VPlacement(k))


_BUILDERS: dict[str, Callable[[str, int, int, int], Schedule]] = {
    "gpipe": BreadthFirst,
    "1f1b": OneForwardOneBackward,
    "interleaved_1f1b": OneForwardOneBackward,
    "zero_bubble": OneForwardOneBackward,
    "zbv": lambda name, k, m, v: ZBV(k, m),
    "looped_bfs": BreadthFirst,
    "interleaved_zero_bubble": OneForwardOneBackward,
    "dualpipev": lambda name, k, m, v: DualPipeV(k, m),
    "v_half": lambda name, k, m, v: controllable_memory.ControllableMemory(name, k, m),
    "v_min": lambda name, k, m, v: controllable_memory.ControllableMemory(name, k, m),
    "forward_only": BreadthFirst,
}
SCHEDULES = tuple(_BUILDERS)  # in the order errors and the command line list them
# What a training step may run: every schedule but evaluation's (no backwards).
TRAINING = tuple(name for name in SCHEDULES if name != "forward_only")


def Make(
    name: str, num_stages: int, num_micro_batches: int, num_virtual_stages: int = 1
) -> Schedule:
    """The schedule `name` for K = num_stages devices (the pipeline's stages when each
    device runs one) and M micro-batches. The names in VIRTUAL build K * num_virtual_stages
    stages (stage s on device s mod K); the V_SHAPED ones 2K on VPlacement's V (where
    num_virtual_stages may be 1 or 2); the others K.

    Raises:
      ScheduleError: unknown name (with a suggestion), bad counts, or an M the
        schedule cannot run.
    """
    if name not in SCHEDULES:
        close = difflib.get_close_matches(str(name), SCHEDULES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ScheduleError(
            f"schedule: unknown schedule {name!r}, expected one of {', '.join(SCHEDULES)}"
            f" (or a Schedule, or the path of a CSV file){hint}"
        )
    counts = num_stages, num_micro_batches, num_virtual_stages
    for key, value in zip(("num_stages", "num_micro_batches", "num_virtual_stages"), counts):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ScheduleError(f"schedule: expected {key} >= 1, received {key}={value!r}")
    if num_virtual_stages > (2 if name in V_SHAPED else 1) and name not in VIRTUAL:
        runs = "two stages per device (V placement)" if name in V_SHAPED else "one per device"
        raise ScheduleError(
            f"schedule {name!r}: num_virtual_stages={num_virtual_stages} needs one of "
            f"{', '.join(VIRTUAL)}; {name!r} runs {runs}"
        )
    sched = _BUILDERS[name](name, *counts)
    simulate.Simulate(sched)  # raises ScheduleError if it cannot run
    return sched


def Resolve(
    spec: str | os.PathLike | Schedule,
    num_devices: int,
    num_micro_batches: int,
    num_virtual_stages: int = 1,
) -> Schedule:
    """What `p.schedule` says, as a validated Schedule for K devices and M micro-batches.

    Args:
      spec: a name in SCHEDULES (built by Make with `num_virtual_stages`), a Schedule
        value, or the path of a CSV file (FromCsvFile); those two carry their own stages
        and placement.

    Raises:
      ScheduleError: unknown name, unreadable CSV, a schedule for other K or M (saying
        received and expected), or one that cannot run (naming the action).
    """
    if isinstance(spec, (str, os.PathLike)) and (spec in SCHEDULES or not IsCsvPath(spec)):
        return Make(str(spec), num_devices, num_micro_batches, num_virtual_stages)
    if isinstance(spec, Schedule):
        sched, where = spec, f"Schedule {spec.name!r}"
    elif isinstance(spec, (str, os.PathLike)):
        sched = FromCsvFile(spec, num_micro_batches, argument="schedule")
        where = f"CSV file {os.fspath(spec)}"
    else:
        raise ScheduleError(
            f"schedule: expected a name in {', '.join(SCHEDULES)}, a Schedule or the path of "
            f"a CSV file; received {type(spec).__name__} {spec!r}"
        )
    if (sched.num_devices, sched.num_micro_batches) != (num_devices, num_micro_batches):
        raise ScheduleError(
            f"schedule: {where} is for num_devices={sched.num_devices}, "
            f"num_micro_batches={sched.num_micro_batches}; expected num_devices={num_devices}, "
            f"num_micro_batches={num_micro_batches}"
        )
    simulate.Simulate(sched)
    return sched


def IsCsvPath(spec: str | os.PathLike) -> bool:
    """Whether `spec` names a CSV file: no schedule's name, and a path where something
    exists (a directory too, which FromCsvFile refuses saying so) or a name ending in .csv."""
    text = os.fspath(spec)
    return text not in SCHEDULES and (os.path.exists(text) or text.lower().endswith(".csv"))
