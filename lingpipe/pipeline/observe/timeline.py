"""A measured timeline: from TensorFlow's profiler trace to one span per pipeline action.

The executor creates every action's ops in a name scope `F_s{stage}_mb{m}`
(`B_..`, `I_..`, `W_..`); the gradient tape names the gradient ops it creates
`gradient_tape/<forward op's name>`, so `gradient_tape/.../F_s1_mb3/...` (or
`.../B_s1_mb3/...` for a replayed forward) is part of the backward of stage 1 on
micro-batch 3. One `Span` per action: its first op's start .. its last op's end.

    spans = timeline.Record(step_fn, logdir, pipeline)   # profiles a call of step_fn
    timeline.Write(logdir, spans, pipeline.Schedule())   # timeline.json, timeline.png
    print(timeline.Compare(spans, pipeline.Schedule()))  # measured vs simulated idle

The profile is read from the `.xplane.pb` that `tf.profiler.experimental` writes
under `logdir/plugins/profile/<run>/` (what TensorBoard's Profile tab shows), on
the host plane, where each op is an event `name:type` inside the executor's
`ExecutorState::Process` event, whose `id` stat is the step (one per call of the
function).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from lingpipe.pipeline.schedules import schedule, simulate
from lingpipe.pipeline.schedules.schedule import Action, Schedule

__all__ = [
    "BusyShare",
    "ChromeTrace",
    "Compare",
    "LatestProfile",
    "ReadXSpace",
    "Record",
    "Span",
    "Spans",
    "TimelineError",
    "Write",
]

_ACTION = re.compile(r"(?:^|/)([FBIW])_s(\d+)_mb(\d+)(?:_\d+)?/")
_HOST_PLANE = "/host:CPU"
# Ops that do no work of their own: they run whenever their (absent) inputs allow,
# often long before the action's data arrives, and would stretch its span.
_NO_WORK = frozenset(
    {"ReadVariableOp", "VarHandleOp", "Const", "NoOp", "_Send", "_Recv", "_HostSend", "_HostRecv"}
)


class TimelineError(ValueError):
    """A profile that holds no pipeline actions, or that cannot be read."""


@dataclasses.dataclass(frozen=True)
class Span:
    """One action of one recorded step, as measured.

    Attributes:
      step: which recorded step (0 for the first call profiled).
      action: the schedule's action.
      device: the pipeline device (track) it ran on, sched.DeviceOf(stage).
      start_us, end_us: its first op's start and last op's end, in microseconds
        from the first recorded action.
      num_ops: how many op events it spans.
      busy_us: the time in which one of its ops ran (the span less its waits).
    """

    step: int
    action: Action
    device: int
    start_us: float
    end_us: float
    num_ops: int
    busy_us: float

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us


@dataclasses.dataclass
class _Op:
    """One op event of an action: its times (picoseconds), the executor's step id, and
    its action's (kind, stage, micro-batch)."""

    start: int
    end: int
    step_id: int | None
    key: tuple[str, int, int]


def LatestProfile(logdir: str) -> str:
    """The newest `*.xplane.pb` under `logdir/plugins/profile/` (any tf.io.gfile path)."""
    found = tf.io.gfile.glob(f"{logdir}/plugins/profile/*/*.xplane.pb")
    if not found:
        raise TimelineError(
            f"timeline: no profile in {logdir}/plugins/profile/; expected a "
            "<run>/<host>.xplane.pb written by tf.profiler.experimental"
        )
    return sorted(found)[-1]  # run directories are named by their start time


def ReadXSpace(path: str) -> Any:
    """The XSpace proto of a `.xplane.pb` file."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    with tf.io.gfile.GFile(path, "rb") as f:
        return xplane_pb2.XSpace.FromString(f.read())


def _HostOps(space: Any, backward_kind: str) -> list[_Op]:
    """The op events of actions on the host plane, each with the step id of its executor
    run; the gradient of a (replayed) forward is of kind `backward_kind`."""
    ops = []
    for plane in (p for p in space.planes if p.name == _HOST_PLANE):
        id_stat = [k for k, v in plane.stat_metadata.items() if v.name == "id"]
        for line in plane.lines:
            runs: list[tuple[int, int, int | None]] = []  # enclosing executor runs
            for ev in line.events:
                name = plane.event_metadata[ev.metadata_id].name
                start = line.timestamp_ns * 1000 + ev.offset_ps
                end = start + ev.duration_ps
                if name == "ExecutorState::Process":
                    ids = [s.int64_value for s in ev.stats if s.metadata_id in id_stat]
                    runs.append((start, end, ids[0] if ids else None))
                    continue
                while runs and runs[-1][1] < start:
                    runs.pop()
                op_name, _, op_type = name.partition(":")
                key = _ActionKey(op_name, backward_kind)
                if op_type and op_type not in _NO_WORK and key is not None:
                    step_id = runs[-1][2] if runs and runs[-1][0] <= start else None
                    ops.append(_Op(start, end, step_id, key))
    return ops


def _ActionKey(name: str, backward_kind: str) -> tuple[str, int, int] | None:
    """(kind, stage, micro-batch) of an op name; None for ops of no action."""
    match = _ACTION.search(name)
    if match is None:
        return None
    kind, stage, m = match.group(1), int(match.group(2)), int(match.group(3))
    if name.startswith("gradient_tape/") or "/gradient_tape/" in name:
        kind = backward_kind  # the gradient of a (replayed) forward
    return kind, stage, m


def _SplitZeroBubble(ops: list[_Op], sched: Schedule) -> None:
    """Zero bubble, for one step's ops: the tape creates a stage's input and weight
    gradients together (in I's scope), and the executor holds the weight-only ops back
    to W's turn. So on each device, a backward's ops that start after another action's
    first op are its weight gradient's: their key becomes W's, in place."""
    seen: set = set()
    started: dict[int, set] = collections.defaultdict(set)  # device -> I's (stage, m)
    interrupted: set = set()
    for op in sorted(ops, key=lambda op: op.start):
        kind, stage, m = op.key
        device = sched.DeviceOf(stage)
        if op.key not in seen:
            seen.add(op.key)
            interrupted.update(started[device] - {(stage, m)})
            if kind == schedule.BACKWARD_INPUT:
                started[device].add((stage, m))
        if kind == schedule.BACKWARD_INPUT and (stage, m) in interrupted:
            op.key = (schedule.BACKWARD_WEIGHT, stage, m)


def _Steps(ops: list[_Op], sched: Schedule) -> list[list[_Op]]:
    """The ops of each recorded step, in the order the steps started.

    A step runs every forward of the schedule. Ops under another executor id (a few
    of one backward, from an executor run of their own) are not a step: each joins
    the latest step that started at or before it; ops before the first step are
    dropped. Without a step that ran every forward, each executor id is a step.
    """
    forwards = {a for acts in sched.device_actions for a in acts if a.kind == schedule.FORWARD}
    by_id: dict = collections.defaultdict(list)
    for op in ops:
        by_id[op.step_id].append(op)
    start = {sid: min(op.start for op in mine) for sid, mine in by_id.items()}
    order = sorted(by_id, key=start.get)
    full = [sid for sid in order if sid is not None and forwards <= {op.key for op in by_id[sid]}]
    if not full:
        return [by_id[sid] for sid in order]  # nothing to join to
    steps: dict = {sid: [] for sid in full}
    for op in ops:
        if op.step_id in steps:
            steps[op.step_id].append(op)
            continue
        earlier = [sid for sid in steps if start[sid] <= op.start]
        if earlier:
            steps[earlier[-1]].append(op)
    return list(steps.values())


def Spans(space: Any, sched: Schedule) -> list[Span]:
    """One span per (recorded step, action) of `sched` found in the profile `space`.

    Steps are numbered 0, 1, ... in the order they started. Raises TimelineError
    if the profile holds no op of any action.
    """
    backward_kind = schedule.BACKWARD_INPUT if sched.splits_backward else schedule.BACKWARD
    ops = [op for op in _HostOps(space, backward_kind) if op.key[1] < sched.num_stages]
    if not ops:
        raise TimelineError(
            "timeline: the profile holds no op of a pipeline action (expected op names "
            "in scopes like F_s0_mb0/); was a pipelined train step run while profiling?"
        )
    steps = _Steps(ops, sched)
    groups: dict = collections.defaultdict(list)
    for step, mine in enumerate(steps):
        if sched.splits_backward:
            _SplitZeroBubble(mine, sched)  # per step: each step's ops alone
        for op in mine:
            groups[(step, op.key)].append(op)
    origin = min(op.start for mine in steps for op in mine)
    spans = [
        Span(
            step,
            Action(*key),
            sched.DeviceOf(key[1]),
            (min(o.start for o in group) - origin) / 1e6,
            (max(o.end for o in group) - origin) / 1e6,
            len(group),
            _UnionLength([(o.start, o.end) for o in group]) / 1e6,
        )
        for (step, key), group in groups.items()
    ]
    return sorted(spans, key=lambda s: (s.start_us, s.device))


def _UnionLength(intervals: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def BusyShare(spans: list[Span], num_devices: int) -> list[float]:
    """Per device, the share of the recorded steps' time in which an op of its actions ran.

    A step's time is its first action's start .. its last action's end (the pipeline's
    makespan, as in the simulation); a span's waits (a recomputation that ran ahead and
    waits for the gradient, say) are idle. Over several steps: summed busy time /
    summed step time, at most 1.
    """
    window = 0.0
    for step in {s.step for s in spans}:
        mine = [s for s in spans if s.step == step]
        window += max(s.end_us for s in mine) - min(s.start_us for s in mine)
    busy = [sum(s.busy_us for s in spans if s.device == d) for d in range(num_devices)]
    return [min(1.0, b / window) if window > 0 else 0.0 for b in busy]


def Compare(spans: list[Span], sched: Schedule) -> str:
    """Per device: measured busy and idle share beside the simulation's idle share."""
    sim = simulate.Simulate(sched)
    busy = BusyShare(spans, sched.num_devices)
    steps = len({s.step for s in spans})
    lines = [
        f"Timeline of {steps} step(s), schedule {sched.name} (K={sched.num_devices}, "
        f"M={sched.num_micro_batches}): measured vs simulated (F=1, B=2 units)"
    ]
    for d in range(sched.num_devices):
        lines.append(
            f"  device {d}: busy {busy[d]:6.1%}  idle {1 - busy[d]:6.1%}  "
            f"(simulated idle {sim.idle_share[d]:6.1%})"
        )
    return "\n".join(lines)


def ChromeTrace(spans: list[Span], sched: Schedule) -> dict:
    """The spans as a Chrome trace event file (chrome://tracing, ui.perfetto.dev):
    one track (tid) per device, one complete ('X') event per span, times in us."""
    events = []
    for d in range(sched.num_devices):
        stages = ", ".join(f"s{s}" for s in sched.StagesOf(d))
        track = {"name": "thread_name", "ph": "M", "ts": 0, "dur": 0, "pid": 0, "tid": d}
        events.append({**track, "args": {"name": f"device {d} ({stages})"}})
    for s in spans:
        args = {"busy_us": s.busy_us, "step": s.step, "stage": s.action.stage}
        args.update(micro_batch=s.action.micro_batch, ops=s.num_ops)
        event = {"name": str(s.action), "cat": s.action.kind, "ph": "X", "ts": s.start_us}
        event.update(dur=s.duration_us, pid=0, tid=s.device, args=args)
        events.append(event)
    about = {"schedule": sched.name, "num_devices": sched.num_devices}
    about["num_micro_batches"] = sched.num_micro_batches
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": about}


def Write(logdir: str, spans: list[Span], sched: Schedule) -> tuple[str, str]:
    """Writes logdir/timeline.json and logdir/timeline.png; returns their paths."""
    from lingpipe.pipeline.observe import plot

    json_path, png_path = f"{logdir}/timeline.json", f"{logdir}/timeline.png"
    tf.io.gfile.makedirs(logdir)
    with tf.io.gfile.GFile(json_path, "w") as f:
        json.dump(ChromeTrace(spans, sched), f)
    plot.PlotSpans(spans, sched, png_path)
    return json_path, png_path


def Record(
    step_fn: Callable[[], Any], logdir: str, pipeline: Any, num_steps: int = 1
) -> list[Span]:
    """Profiles `num_steps` calls of `step_fn` into `logdir` and returns their spans.

    `step_fn` runs one pipelined training step (a `tf.function` calling
    `PipeliningLayer.ForwardBackward`, say); it is called once first, unprofiled,
    so that tracing stays out of the record. `pipeline` is the PipeliningLayer (its
    `Schedule()` is used) or a Schedule. The profile stays in logdir for
    TensorBoard's Profile tab.
    """
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"timeline.Record: expected num_steps >= 1, received {num_steps!r}")
    sched = pipeline if isinstance(pipeline, Schedule) else pipeline.Schedule()
    _Block(step_fn())
    tf.profiler.experimental.start(logdir)
    try:
        for _ in range(num_steps):
            _Block(step_fn())
    finally:
        tf.profiler.experimental.stop()
    return Spans(ReadXSpace(LatestProfile(logdir)), sched)


def _Block(result: Any) -> None:
    """Waits for the step's tensors (eager ops return before they finish on devices)."""
    for x in tf.nest.flatten(result):
        if isinstance(x, (tf.Tensor, tf.Variable)):
            x.numpy()
