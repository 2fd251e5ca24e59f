"""The planner's search: N devices as R replicas x K stages, M micro-batches, a schedule,
a recompute policy and a partition, the fastest predicted to fit a memory cap.

    rates = planner.MeasureRates()                       # this machine's device
    result = planner.Search(model_costs, rates, num_devices=2, memory_per_device=2**30,
                            global_batch=32, memory_fn=...)
    result.chosen.Flags()                                # the trainer's flags
    cal_costs, cal_rates = planner.Calibrated(costs, rates, calibration)

Step time is predicted by simulating the candidate's schedule (lingpipe.pipeline.
simulate) with the cost of every action (lingpipe.pipeline.planning.cost_model.ActionCosts):
each cell's forward, inputs' gradient and weights' gradient (profiled on the device,
`ModelCosts.times`; else the forward FLOPs at the device's measured rate, each gradient
as long), the forward replayed where the recompute policy drops the activations, a
fixed cost per action (measured on the executor), each micro-batch's weight gradients
added to the stage's sum (its weight bytes at a measured rate), and the transfer of a
stage's inputs (and of their gradient back) as bytes over the measured bandwidth plus
a latency when the neighbouring stage is on another device. Where several devices
compute at once, their compute is slower by the measured `contention` (logical devices
sharing a host's cores). The step adds the sums' final scaling and the optimizer's
apply (each device its weights' bytes at measured rates) and, with R > 1 replicas, a
ring all-reduce of each device's weight gradients. lingpipe.pipeline.planning.calibrate fits
the device scale and the fixed costs per action and per step to measured timelines
(`Calibrated`).
Memory per device comes from the caller's `memory_fn` (lingpipe.plan estimates it from
the schedule with lingpipe.pipeline.observe.memory: micro-batches alive, weight gradients held
by deferred W's, optimizer slots, workspace, every stage the device holds).

The search never builds the model: costs are per cell, computed once.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

from lingpipe.pipeline.planning import cost_model, device_rates, partition
from lingpipe.pipeline.schedules import generators, simulate
from lingpipe.pipeline.step import settings

__all__ = [
    "ActionSeconds",
    "CachedMemory",
    "Calibrated",
    "CalibrationProbes",
    "Candidate",
    "Candidates",
    "CellTimesOf",
    "Compute",
    "Contention",
    "FirstStageWithoutInputGradient",
    "MeasureRates",
    "MeasuredLater",
    "MICRO_BATCHES",
    "ModelCosts",
    "OutsideSeconds",
    "Partitions",
    "PredictSeconds",
    "Rates",
    "Refused",
    "REMAT",
    "Result",
    "ScheduleOf",
    "SCHEDULES",
    "SchedulesNamed",
    "Search",
]

# Schedules the search tries by default, with their stages per device (v).
SCHEDULES = (
    ("gpipe", 1),
    ("1f1b", 1),
    ("zero_bubble", 1),
    ("interleaved_1f1b", 2),
    ("zbv", 1),
    ("v_half", 1),
    ("v_min", 1),
)
REMAT = ("never", "except_last", "always")
MICRO_BATCHES = (1, 2, 4, 8, 16)


def SchedulesNamed(names: Sequence[str], virtual: int | None = None) -> tuple:
    """(name, stages per device) to try of each schedule in `names`: its entries in
    SCHEDULES, else (a training schedule searched only when named, as looped_bfs) 2 if it
    places stages in a loop (generators.VIRTUAL), else 1; with `virtual`, only the entries
    of that many stages per device, or (name, virtual) where it lists none. In SCHEDULES'
    order however they were given (a tie between two candidates goes to the first)."""
    order = list(dict.fromkeys([name for name, _ in SCHEDULES] + list(names)))
    out = []
    for name in sorted(set(names), key=order.index):
        listed = [e for e in SCHEDULES if e[0] == name] or [
            (name, 2 if name in generators.VIRTUAL else 1)
        ]
        if virtual is not None:
            listed = [e for e in listed if e[1] == virtual] or [(name, virtual)]
        out.extend(listed)
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class Rates:
    """What a device does per second: FLOPs, the fixed cost of one action, cross-device
    transfer (bytes per second and a latency), the optimizer's apply and a gradient's
    addition to a sum per weight byte, `contention`: the factor on compute while
    every device computes (1: devices with cores of their own), `step_s`: the fixed
    cost of a step beyond its actions (0 until a calibration with two or more probes
    measures it, lingpipe.pipeline.planning.calibrate), and the apply's and the
    addition's own cost per weight (per variable, beside its bytes: the ops each
    weight runs, device_rates.MeasureWeightSeconds)."""

    flops_per_s: float
    action_s: float
    bytes_per_s: float
    latency_s: float
    apply_s_per_byte: float = 0.0
    add_s_per_byte: float = 0.0
    contention: float = 1.0
    step_s: float = 0.0
    apply_s_per_weight: float = 0.0
    add_s_per_weight: float = 0.0


@dataclasses.dataclass(frozen=True)
class ModelCosts:
    """Per cell, for one example: forward FLOPs, the bytes of its outputs (what crosses
    to the next cell), and its weights' bytes; `times`, the cells' profiled times
    (cost_model.CellTimes), or None for FLOPs at the measured rate; `weight_counts`,
    its trainable variables (each pays Rates' costs per weight), or () where not
    counted (none paid); `input_gradient`, whether the step reads the gradient of the
    pipeline's inputs (layers with weights before it would): a task that is its
    pipeline, as the planner's are, and a Keras graph do not, so the first stage leaves
    it out (FirstStageWithoutInputGradient)."""

    flops: tuple[float, ...]
    out_bytes: tuple[int, ...]
    weight_bytes: tuple[int, ...]
    times: cost_model.CellTimes | None = None
    weight_counts: tuple[int, ...] = ()
    input_gradient: bool = False

    def StageWeights(self, counts: Sequence[int]) -> list[tuple[int, int]]:
        """(bytes, variables) of each stage's weights, for cells per stage `counts`."""
        bounds = partition.Boundaries(list(counts))
        number = self.weight_counts or (0,) * len(self.weight_bytes)
        return [(sum(self.weight_bytes[lo:hi]), sum(number[lo:hi])) for lo, hi in bounds]


@dataclasses.dataclass
class Candidate:
    """One configuration and what the planner predicts for it."""

    replicas: int
    num_stages: int  # devices per pipeline (K)
    num_micro_batches: int
    schedule: str
    num_virtual_stages: int
    remat: str
    partition: tuple[int, ...]  # cells per stage of the schedule
    partition_policy: str = "uniform"  # what gives `partition`: 'flops' or 'uniform'
    step_seconds: float = 0.0
    peak_bytes: tuple[int, ...] = ()  # per device of one pipeline

    def Settings(self) -> dict[str, Any]:
        """The pipeline settings this plan fixes, as PipeliningLayer.Params and
        lingpipe.keras.Pipeline take them (the partition as counts per stage)."""
        return dict(
            num_stages=self.num_stages,
            num_micro_batches=self.num_micro_batches,
            schedule=self.schedule,
            num_virtual_stages=self.num_virtual_stages,
            remat=self.remat,
            partition=list(self.partition),
        )

    def Flags(self) -> dict[str, Any]:
        """The trainer's flags for this plan: each pipeline setting it fixes (settings.FLAGS;
        the partition as its counts per stage), and the strategy and devices of its
        replicas."""
        flags = {name: getattr(self, name) for name in settings.FLAGS if hasattr(self, name)}
        flags["partition"] = list(self.partition)
        if isinstance(self.remat, (list, tuple)):
            flags["remat"] = list(self.remat)
        if self.replicas > 1:
            flags["strategy"] = "mirrored"
            flags["logical_devices"] = self.replicas * self.num_stages
        return flags

    def Describe(self) -> str:
        v = f" v={self.num_virtual_stages}" if self.num_virtual_stages > 1 else ""
        return (
            f"R={self.replicas} x K={self.num_stages}, M={self.num_micro_batches}, "
            f"{self.schedule}{v}, remat={self.remat}, partition={self.partition_policy} "
            f"{list(self.partition)}"
        )


@dataclasses.dataclass
class Refused:
    """A candidate predicted not to fit: its most loaded device and the bytes over the cap."""

    candidate: Candidate
    device: int
    excess_bytes: int


@dataclasses.dataclass
class Result:
    chosen: Candidate | None
    runners_up: list[Candidate]
    refused: list[Refused]
    searched: int
    ranked: list[Candidate] = dataclasses.field(default_factory=list)  # all that fit, fastest first
    costs: ModelCosts | None = None  # what the caller planned with
    costs_note: str = ""  # which costs, in a line (lingpipe.plan's screen)


def MeasuredLater(device: str | None = None) -> Callable[[], Rates]:
    """MeasureRates(device) as a function that measures on its first call and returns
    the same Rates after: Search calls it only once a candidate fits, so a cap too small
    for anything is refused without the few seconds of timed runs."""
    return functools.cache(functools.partial(MeasureRates, device))


def MeasureRates(device: str | None = None) -> Rates:
    """This machine's rates, measured in a few seconds (lingpipe.pipeline.planning.
    device_rates): a 512 x 512 matmul's FLOPs per second, the executor's fixed cost per
    action, a tensor's crossing between two devices inside a step (latency and
    bandwidth; none where there is one device), Adam's apply and a sum's addition per
    weight byte and per weight, and the contention of every device computing at once."""
    import tensorflow as tf

    devices = [d.name for d in tf.config.list_logical_devices()]
    gpus = [d for d in devices if "GPU" in d or "TPU" in d]
    here = device or (gpus or devices)[0]
    there = ([d for d in (gpus or devices) if d != here] or [here])[0]
    bytes_per_s, latency_s = device_rates.MeasureTransfer(here, there)
    apply_per_weight, add_per_weight = device_rates.MeasureWeightSeconds(here)
    return Rates(
        flops_per_s=device_rates.MeasureFlopsPerSecond(here),
        action_s=device_rates.MeasureActionSeconds([here] if here == there else [here, there]),
        bytes_per_s=bytes_per_s,
        latency_s=latency_s,
        apply_s_per_byte=device_rates.MeasureApplySecondsPerByte(here),
        add_s_per_byte=device_rates.MeasureAddSecondsPerByte(here),
        contention=device_rates.MeasureContention(gpus or devices),
        apply_s_per_weight=apply_per_weight,
        add_s_per_weight=add_per_weight,
    )


def CellTimesOf(costs: ModelCosts, rates: Rates) -> cost_model.CellTimes:
    """The profiled times, or the forward FLOPs at the measured rate."""
    return costs.times or cost_model.FlopTimes(costs.flops, rates.flops_per_s)


def Contention(candidate: Candidate, rates: Rates) -> float:
    """The factor on the candidate's compute: rates.contention where it uses more than
    one device (all of them compute at once), else 1."""
    return rates.contention if candidate.replicas * candidate.num_stages > 1 else 1.0


def ActionSeconds(
    candidate: Candidate,
    costs: ModelCosts,
    rates: Rates,
    global_batch: int,
    action_s: float | None = None,
    contended: bool = True,
) -> dict[str, dict[tuple[int, int], float]]:
    """Per kind, {(stage, micro-batch): seconds} of the candidate's actions
    (cost_model.ActionCosts with this model's cells, sums and transfers); `action_s`
    replaces rates.action_s (0: the actions' compute alone, what calibrate.Fit takes).
    contended: every action with all of the candidate's devices computing (the
    contention, and a B's two gradients apart); else each as on a device alone."""
    sched = ScheduleOf(candidate)
    micro = global_batch / candidate.replicas / candidate.num_micro_batches

    def Transfer(cell: int) -> float:
        return costs.out_bytes[cell] * micro / rates.bytes_per_s + rates.latency_s

    per_stage = costs.StageWeights(candidate.partition)
    return cost_model.ActionCosts(
        sched,
        candidate.partition,
        CellTimesOf(costs, rates),
        micro,
        rates.action_s if action_s is None else action_s,
        candidate.remat,
        Transfer,
        sum_s=[b * rates.add_s_per_byte + n * rates.add_s_per_weight for b, n in per_stage],
        contention=Contention(candidate, rates) if contended else 1.0,
        contended=contended and candidate.replicas * candidate.num_stages > 1,
        lockstep=candidate.replicas > 1,
        no_input_gradient=FirstStageWithoutInputGradient(costs, candidate.partition[0]),
    )


def FirstStageWithoutInputGradient(costs: ModelCosts, first_stage_cells: int) -> tuple[int, ...]:
    """The cells of the first stage whose inputs' gradient no step computes: those up to
    and including its first cell with weights, before which nothing has weights to pass
    it to; none where the step reads the pipeline's inputs' gradient
    (costs.input_gradient). The executor asks every stage for its inputs' gradient, and
    Grappler, TensorFlow's graph optimizer, drops what nothing reads (the 512-wide MLP's
    first stage of four cells ran seven matmuls in each backward, its second eight)."""
    if costs.input_gradient:
        return ()
    has_weights = costs.weight_counts or costs.weight_bytes
    for c in range(first_stage_cells):
        if has_weights[c]:
            return tuple(range(c + 1))
    return tuple(range(first_stage_cells))


def ScheduleOf(candidate: Candidate) -> Any:
    """The candidate's schedule (generators.Make)."""
    return generators.Make(
        candidate.schedule,
        candidate.num_stages,
        candidate.num_micro_batches,
        candidate.num_virtual_stages,
    )


def Compute(candidate: Candidate, costs: ModelCosts, rates: Rates, global_batch: int) -> dict:
    """{Action: seconds} of every action of the candidate's schedule without the fixed
    cost per action: what calibrate.Fit compares with the timeline's busy times. As in
    PredictSeconds, an action costs what it does on a device alone, and for the part
    of it during which another device runs an action, what it does contended."""
    sched = ScheduleOf(candidate)
    together = ActionSeconds(candidate, costs, rates, global_batch, action_s=0.0)
    if candidate.replicas > 1 or candidate.num_stages == 1:
        alone, shared = together, {}
    else:
        alone = ActionSeconds(candidate, costs, rates, global_batch, 0.0, contended=False)
        shared = _Shared(sched, simulate.Simulate(sched, alone))
    out = {}
    for acts in sched.device_actions:
        for a in acts:
            key = (a.stage, a.micro_batch)
            part = min(1.0, shared.get(a, 0.0) / alone[a.kind][key]) if alone[a.kind][key] else 0.0
            out[a] = alone[a.kind][key] + part * (together[a.kind][key] - alone[a.kind][key])
    return out


def _Shared(sched: Any, sim: Any) -> dict:
    """{action: seconds of it during which another device runs an action} in `sim`."""
    out = {}
    for a, start in sim.start.items():
        here = sched.DeviceOf(a.stage)
        others = [(sim.start[b], sim.end[b]) for b in sim.start if sched.DeviceOf(b.stage) != here]
        out[a] = sum(max(0.0, min(sim.end[a], e) - max(start, b)) for b, e in others)
    return out


def OutsideSeconds(candidate: Candidate, costs: ModelCosts, rates: Rates) -> float:
    """What the step adds to the pipeline's makespan: the sums' final scaling and the
    optimizer's apply (each device its weights, in parallel), the replicas' ring
    all-reduce, and the fixed cost of a step (rates.step_s)."""
    sched = ScheduleOf(candidate)
    device_bytes, device_weights = [0.0] * sched.num_devices, [0] * sched.num_devices
    for s, (nbytes, number) in enumerate(costs.StageWeights(candidate.partition)):
        device_bytes[sched.DeviceOf(s)] += nbytes
        device_weights[sched.DeviceOf(s)] += number
    per_byte = (rates.apply_s_per_byte + rates.add_s_per_byte) * Contention(candidate, rates)
    per_weight = rates.apply_s_per_weight + rates.add_s_per_weight
    seconds = cost_model.OptimizerSeconds(device_bytes, per_byte, device_weights, per_weight)
    seconds += rates.step_s
    if candidate.replicas > 1:
        r = candidate.replicas
        grads = max(device_bytes)
        seconds += 2 * (r - 1) / r * grads / rates.bytes_per_s + rates.latency_s
    return seconds


def _Stretch(sim: Any, alone: dict, together: dict) -> float:
    """Seconds that `sim` (simulated with the `alone` costs) gains where two or more
    devices run an action at once: each such second is stretched by the largest
    together / alone ratio of the actions running in it."""

    def Ratio(a: Any) -> float:
        key = (a.stage, a.micro_batch)
        return together[a.kind][key] / alone[a.kind][key] if alone[a.kind][key] > 0 else 1.0

    events = []
    for a, start in sim.start.items():
        if sim.end[a] > start:
            events += [(start, 1, a), (sim.end[a], -1, a)]
    stretch, running, last = 0.0, set(), 0.0
    for t, step, a in sorted(events, key=lambda e: (e[0], e[1])):
        if len(running) >= 2:
            stretch += (t - last) * (max(Ratio(r) for r in running) - 1.0)
        if step > 0:
            running.add(a)
        else:
            running.discard(a)
        last = t
    return stretch


def PredictSeconds(
    candidate: Candidate, costs: ModelCosts, rates: Rates, global_batch: int
) -> float:
    """The candidate's step time: its schedule simulated with every action's cost
    (ActionSeconds), plus what the step adds outside the pipeline (OutsideSeconds).

    Other devices computing slow a device down (the contention, and a B's gradients
    no longer run at once, cost_model.CellTimes.BackwardAlone). Replicas always compute
    together, so their actions are all contended. The stages of one pipeline overlap
    only in part: the schedule is simulated with each action as on a device alone,
    and each second in which two or more of its devices run an action at once is
    stretched by the running actions' largest contended / alone ratio (a first-order
    correction: the stretch does not move later actions' dependencies)."""
    sched = ScheduleOf(candidate)
    together = ActionSeconds(candidate, costs, rates, global_batch)
    if candidate.replicas > 1 or candidate.num_stages == 1:
        makespan = simulate.Simulate(sched, together).makespan
    else:
        alone = ActionSeconds(candidate, costs, rates, global_batch, contended=False)
        sim = simulate.Simulate(sched, alone)
        makespan = sim.makespan + _Stretch(sim, alone, together)
    return makespan + OutsideSeconds(candidate, costs, rates)


def Calibrated(costs: ModelCosts, rates: Rates, calibration: Any) -> tuple[ModelCosts, Rates]:
    """The costs and rates a calibrate.Calibration gives: the cells' times times its
    device scale (FLOPs at the rate over it where there is no profile), its fixed cost
    per action and per step."""
    if costs.times is None:
        rates = dataclasses.replace(rates, flops_per_s=rates.flops_per_s / calibration.scale)
    else:
        costs = dataclasses.replace(costs, times=costs.times.Scaled(calibration.scale))
    return costs, dataclasses.replace(
        rates, action_s=calibration.action_s, step_s=calibration.step_s
    )


def CalibrationProbes(
    candidate: Candidate, costs: ModelCosts, global_batch: int
) -> list[Candidate]:
    """What calibrate.FitProbes records: one replica of `candidate`, and its 1F1B twin
    (one stage per device, cut by the same partition policy) at the number of
    micro-batches of MICRO_BATCHES that the replica's batch allows farthest from its
    own (ties: the larger), so that the two differ in micro-batch size and in number
    of actions."""
    one = dataclasses.replace(candidate, replicas=1)
    batch = global_batch // candidate.replicas
    others = [m for m in MICRO_BATCHES if m <= batch and m != candidate.num_micro_batches]
    if not others or candidate.num_stages < 2:
        return [one]
    m = max(others, key=lambda m: (abs(math.log(m / candidate.num_micro_batches)), m))
    by_policy = dict(Partitions(costs, candidate.num_stages))
    counts = by_policy.get(candidate.partition_policy) or next(iter(by_policy.values()))
    twin = dataclasses.replace(
        one, num_micro_batches=m, schedule="1f1b", num_virtual_stages=1, partition=counts
    )
    return [one, twin]


def Partitions(costs: ModelCosts, num_stages: int) -> list[tuple[str, tuple[int, ...]]]:
    """The partitions tried, as PipeliningLayer cuts them: (policy, cells per stage) for
    'flops' (balanced by FLOPs) and 'uniform' (by cell count), each once."""
    if num_stages > len(costs.flops):
        return []
    found: dict = {}
    for policy, weights in (("flops", list(costs.flops)), ("uniform", [1.0] * len(costs.flops))):
        found.setdefault(tuple(partition.MinMaxPartition(weights, num_stages)), policy)
    return [(policy, counts) for counts, policy in found.items()]


def Candidates(
    num_devices: int,
    num_cells: int,
    global_batch: int,
    schedules: Sequence[tuple[str, int]] = SCHEDULES,
    remats: Sequence[str] = REMAT,
    micro_batches: Sequence[int] = MICRO_BATCHES,
    stages: Sequence[int] | None = None,
) -> list[Candidate]:
    """Every (R, K, M, schedule, v, remat) that applies, partitions left empty."""
    out = []
    for k in range(1, num_devices + 1):
        if num_devices % k or (stages is not None and k not in stages):
            continue
        r = num_devices // k
        if global_batch % r:
            continue
        per_replica = global_batch // r
        for (name, v), m, remat in itertools.product(schedules, micro_batches, remats):
            chunks = k * (2 if name in generators.V_SHAPED else v)
            if m > per_replica or chunks > num_cells:
                continue
            if k == 1 and (name != "gpipe" or v > 1):
                continue  # one device: every schedule is the same work in one order
            if name == "interleaved_1f1b" and m % k:
                continue
            if name == "dualpipev" and m < 2 * k:
                continue
            out.append(Candidate(r, k, m, name, v, remat, ()))
    return out


def CachedMemory(
    memory_fn: Callable[[Candidate], Sequence[int]],
) -> Callable[[Candidate], Sequence[int]]:
    """`memory_fn`, each candidate's estimate computed once (by Describe(): its R, K, M,
    schedule, remat and partition): what a second Search over other costs reuses."""
    found: dict[str, Sequence[int]] = {}

    def Memory(c: Candidate) -> Sequence[int]:
        key = c.Describe()
        if key not in found:
            found[key] = memory_fn(c)
        return found[key]

    return Memory


def Search(
    costs: ModelCosts,
    rates: Rates | Callable[[], Rates],
    num_devices: int,
    memory_per_device: int,
    global_batch: int,
    memory_fn: Callable[[Candidate], Sequence[int]],
    candidates: Sequence[Candidate] | None = None,
    keep: int = 3,
) -> Result:
    """The fastest predicted candidate whose every device fits `memory_per_device`, the
    next `keep` runners-up, and each refused candidate with its device and excess.
    Deterministic: ties go to fewer stages, fewer micro-batches, then the order tried.
    `rates` may be a function that measures them (MeasureRates): called only once a
    candidate fits, as only a fitting candidate's time is predicted."""
    if candidates is None:
        candidates = Candidates(num_devices, len(costs.flops), global_batch)
    fits, refused = [], []
    for base in candidates:
        chunks = base.num_stages * (
            2 if base.schedule in generators.V_SHAPED else base.num_virtual_stages
        )
        for policy, counts in Partitions(costs, chunks):
            c = dataclasses.replace(base, partition=counts, partition_policy=policy)
            c.peak_bytes = tuple(int(b) for b in memory_fn(c))
            worst = max(range(len(c.peak_bytes)), key=lambda d: c.peak_bytes[d])
            if c.peak_bytes[worst] > memory_per_device:
                refused.append(Refused(c, worst, c.peak_bytes[worst] - memory_per_device))
                continue
            if not isinstance(rates, Rates):
                rates = rates()
            c.step_seconds = PredictSeconds(c, costs, rates, global_batch)
            fits.append(c)
    order = sorted(
        range(len(fits)),
        key=lambda i: (fits[i].step_seconds, fits[i].num_stages, fits[i].num_micro_batches, i),
    )
    ranked = [fits[i] for i in order]
    refused.sort(key=lambda x: (x.excess_bytes, x.candidate.num_stages))
    chosen = ranked[0] if ranked else None
    searched = len(fits) + len(refused)
    return Result(chosen, ranked[1 : 1 + keep], refused, searched, ranked)
