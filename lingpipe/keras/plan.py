"""lingpipe.keras.Plan: how to pipeline a built Keras model on N devices under a memory cap.

    plan = lingpipe.keras.Plan(model, devices=2, memory_per_device="512MiB", batch_size=64)
    print(plan)                                   # the choice, runners-up, refusals
    piped = lingpipe.keras.Pipeline(model, plan=plan)
    # or both at once:
    piped = lingpipe.keras.Pipeline(model, plan="auto", memory_per_device="512MiB",
                                    batch_size=64)

It searches K stages on K of the N devices (K=1: no pipeline, the model on one
device), M micro-batches, the schedule (and its stages per device), the recompute
policy and the partition with lingpipe.pipeline.planning.planner, and returns the plan
predicted to be fastest among those predicted to fit the cap on every device. The
model is traced once (lingpipe.keras.graph): each layer call's FLOPs, the bytes
crossing a cut after it and its layer's weights are the planner's costs per unit
(planner.ModelCosts), and graph_memory estimates each candidate's memory per device
from the schedule. Each layer call's F, I, W and B times are profiled on this device
at the smallest and largest micro-batch (lingpipe.keras.graph_times; calls alike are
timed once) where the largest call can be profiled here, else FLOPs at the measured
rate are its costs. Nothing is built per candidate.

The Keras pipeline has no data parallelism of its own, so every plan has one replica;
devices a plan leaves out (K < N) stay idle.

Restrictions (keyword arguments, each one value or a list of them): `num_stages`,
`num_micro_batches`, `schedules`, `remat`. Also: `optimizer` (a Keras optimizer or a
number of weight-sized slots per weight; default the model's compiled optimizer, else
2, Adam's), `rates` (planner.Rates; default measured here, planner.MeasureRates) and
`costs` ('auto', the default, as above; 'profile' or 'flops' forces one, as
`python -m lingpipe.plan --costs` does).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import inspect
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from lingpipe import plan as plan_lib
from lingpipe.keras import graph as graph_lib
from lingpipe.keras import graph_memory
from lingpipe.pipeline.observe import update_memory
from lingpipe.pipeline.planning import partition, planner, report
from lingpipe.pipeline.schedules import generators

__all__ = [
    "KerasPlan",
    "KNOBS",
    "Knobs",
    "COSTS",
    "ModelCosts",
    "Plan",
    "PlanCosts",
    "RecordsGivenArguments",
    "ResolveArgs",
    "RESTRICTIONS",
    "WHERE",
]

# Plan's restrictions, and the knobs of lingpipe.keras.Pipeline a plan sets.
RESTRICTIONS = (
    "num_stages", "num_micro_batches", "schedules", "remat", "optimizer", "rates", "costs",
)  # fmt: skip
COSTS = ("auto", "profile", "flops")
KNOBS = ("num_stages", "num_micro_batches", "schedule", "num_virtual_stages", "remat", "partition")
WHERE = "lingpipe.keras.Plan"


def Knobs(c: planner.Candidate) -> dict[str, Any]:
    """lingpipe.keras.Pipeline's arguments for candidate `c` (the partition as layer calls
    per stage of its schedule)."""
    return c.Settings()


@dataclasses.dataclass
class KerasPlan:
    """A chosen configuration of lingpipe.keras.Pipeline, and what was predicted.

    Attributes:
      knobs: Pipeline's arguments (KNOBS) of the chosen candidate.
      chosen: the planner's candidate (step_seconds, peak_bytes per device, ...).
      runners_up: the next fastest that fit.
      refused: planner.Refused for each candidate over the cap: its device and excess.
      model_name, num_nodes: the model planned for (its layer calls).
      num_devices: N; devices: their names, or None for the cluster's.
      memory_per_device, batch_size: the cap and the global batch.
      searched: candidates considered.
      note: what the memory estimate assumed.
      costs_note: which costs the step times were predicted with.
    """

    knobs: dict
    chosen: planner.Candidate
    runners_up: list
    refused: list
    model_name: str
    num_nodes: int
    num_devices: int
    devices: list | None
    memory_per_device: int
    batch_size: int
    searched: int
    note: str
    costs_note: str = ""

    @property
    def step_seconds(self) -> float:
        return self.chosen.step_seconds

    @property
    def peak_bytes(self) -> tuple[int, ...]:
        """Predicted peak per device of the pipeline (K entries)."""
        return tuple(self.chosen.peak_bytes)

    @property
    def pipelined(self) -> bool:
        """False when the plan is K=1: no pipeline, the model on one device."""
        return self.chosen.num_stages > 1

    def CheckModel(self, graph: graph_lib.Graph, where: str) -> None:
        """One ValueError line when `graph` is not the model this plan was made for."""
        if len(graph.nodes) != self.num_nodes:
            raise ValueError(
                f"{where}: the plan was made for model {self.model_name!r} of "
                f"{self.num_nodes} layer call(s), received model {graph.model.name!r} of "
                f"{len(graph.nodes)}; plan this model with lingpipe.keras.Plan"
            )

    def __str__(self) -> str:
        c = self.chosen
        what = (
            "no pipeline: the model on one device"
            if c.num_stages == 1
            else (f"a pipeline of {c.num_stages} devices")
        )
        knobs = ", ".join(f"{k}={v!r}" for k, v in self.knobs.items())
        return report.PlanScreen(
            f"plan for {self.model_name!r}, batch {self.batch_size}, {self.num_devices} "
            f"device(s), cap {report.Bytes(self.memory_per_device)} per device "
            f"({self.searched} candidates; {self.note}; costs: {self.costs_note}):",
            c,
            what,
            f"lingpipe.keras.Pipeline(model, {knobs})",
            self.runners_up,
            self.refused,
            ms_digits=2,
        )

    def summary(self, print_fn: Any = None) -> None:
        """Prints str(plan) (Keras' summary convention)."""
        (print_fn or print)(str(self))


def _CheckNames(restrictions: dict, where: str) -> None:
    for name in restrictions:
        if name in RESTRICTIONS:
            continue
        close = difflib.get_close_matches(name, RESTRICTIONS + ("memory_per_device",), 1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise ValueError(
            f"{where}: unknown argument {name}; expected devices, memory_per_device, "
            f"batch_size or a restriction of {', '.join(RESTRICTIONS)}{hint}"
        )


def _Values(value: Any, name: str, where: str, check: Any, expected: str) -> tuple:
    """A restriction as a tuple of the values to try (one value, or a list of them)."""
    values = tuple(value) if isinstance(value, (list, tuple, range)) else (value,)
    if not values or not all(check(v) for v in values):
        raise ValueError(
            f"{where}: expected {name} to be {expected} or a list of them, received "
            f"{name}={value!r}"
        )
    return values


def _PositiveInt(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _Schedules(names: Any, where: str) -> tuple:
    """(name, stages per device) of each schedule to try: planner.SCHEDULES, or those named."""
    if names is None:
        return planner.SCHEDULES
    known = tuple(s for s in generators.SCHEDULES if s != "forward_only")
    picked = _Values(names, "schedules", where, lambda s: s in known, f"one of {known}")
    return planner.SchedulesNamed(picked)


def _Candidates(n: int, num_nodes: int, batch: int, r: dict, where: str) -> list:
    """Every candidate of one replica on K <= n devices that the restrictions allow."""
    count = "a positive integer"
    stages = _Values(r.get("num_stages", range(1, n + 1)), "num_stages", where, _PositiveInt, count)
    micro = r.get("num_micro_batches", planner.MICRO_BATCHES)
    micro = _Values(micro, "num_micro_batches", where, _PositiveInt, count)
    remats = r.get("remat", planner.REMAT)
    remats = _Values(
        remats, "remat", where, lambda x: x in planner.REMAT, f"one of {planner.REMAT}"
    )
    if max(stages) > n:
        raise ValueError(
            f"{where}: expected num_stages <= devices={n}, received num_stages={max(stages)}"
        )
    schedules = _Schedules(r.get("schedules"), where)
    out = []
    for k in sorted(set(stages)):
        found = planner.Candidates(k, num_nodes, batch, schedules, remats, micro, stages=(k,))
        out += [c for c in found if c.replicas == 1]
    return out


def ModelCosts(graph: graph_lib.Graph) -> planner.ModelCosts:
    """Per layer call, one example: FLOPs, the bytes a cut after it sends on (every tensor
    alive across it: skips and second inputs too), its layer's trainable weights' bytes
    and number where first called."""
    return planner.ModelCosts(
        flops=tuple(float(graph_lib.NodeFlops(n)) for n in graph.nodes),
        out_bytes=tuple(graph_lib.CutBytes(graph)),
        weight_bytes=tuple(graph_memory.WeightBytes(graph, trainable=True)),
        weight_counts=tuple(graph_memory.WeightCounts(graph)),
    )


def _CheckCosts(source: Any) -> None:
    if not isinstance(source, str) or source not in COSTS:
        raise ValueError(f"{WHERE}: expected costs to be one of {COSTS}, received {source!r}")


def PlanCosts(
    graph: graph_lib.Graph,
    candidates: Sequence[planner.Candidate],
    batch: int,
    cap: int,
    source: str = "auto",
    device: str | None = None,
    flop_costs: planner.ModelCosts | None = None,
) -> tuple[planner.ModelCosts, str]:
    """(costs, a line saying which) for `source` (module doc): ModelCosts with each layer
    call's times profiled at the smallest and largest micro-batch of `candidates` on
    `device` (default: where the model's weights are), or without (FLOPs at the rate):
    `flop_costs`, ModelCosts(graph) when not given."""
    _CheckCosts(source)
    flop_costs = flop_costs or ModelCosts(graph)
    if source == "flops":
        return flop_costs, "FLOPs at the measured rate (costs='flops')"
    micro = sorted({-(-batch // c.num_micro_batches) for c in candidates})
    sizes = sorted({micro[0], micro[-1]})
    need = plan_lib.ProfileNeed(flop_costs, sizes[-1])
    have, what = plan_lib.DeviceBytes(cap)
    if need > have:
        if source == "profile":
            raise ValueError(
                f"{WHERE}: costs='profile': profiling the largest layer call of "
                f"{graph.model.name!r} needs {report.Bytes(need)}, {what} is "
                f"{report.Bytes(have)}; pass costs='flops' (or 'auto')"
            )
        return flop_costs, (
            f"FLOPs at the measured rate (profiling the largest layer call needs "
            f"{report.Bytes(need)}, {what} is {report.Bytes(have)})"
        )
    from lingpipe.keras import graph_times

    with tf.device(device) if device else contextlib.nullcontext():
        times = graph_times.Profile(graph, sizes)
    sizes_text = " and ".join(map(str, sizes))
    note = f"profiled per layer call here (F, I, W at micro-batches of {sizes_text})"
    return dataclasses.replace(flop_costs, times=times), note


def _Devices(devices: Any, where: str) -> tuple[int, list | None]:
    if isinstance(devices, (list, tuple)) and devices and all(isinstance(d, str) for d in devices):
        return len(devices), list(devices)
    if not _PositiveInt(devices):
        raise ValueError(
            f"{where}: expected devices to be a number of devices >= 1 or a list of device "
            f"names, received devices={devices!r}"
        )
    return devices, None


def _Optimizer(model: Any, optimizer: Any) -> tuple[Any, update_memory.UpdateCost, str]:
    """(slots per weight, the update's cost, a note) of the optimizer the plan counts."""
    if optimizer is None:
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None:
            note = "2 optimizer slots per weight and Adam's update (pass optimizer=)"
            return 2, update_memory.UpdateCostOf(2, WHERE), note
    slots = graph_memory.SlotsPerWeight(optimizer, WHERE)
    name = f"{type(optimizer).__name__}, " if not isinstance(optimizer, (int, float)) else ""
    return (
        slots,
        update_memory.UpdateCostOf(optimizer, WHERE),
        (f"optimizer slots: {name}{slots:g} per weight"),
    )


def Plan(
    model: Any,
    devices: Any = None,
    memory_per_device: Any = None,
    batch_size: int | None = None,
    **restrictions: Any,
) -> KerasPlan:
    """The fastest plan predicted to fit `memory_per_device` on every device (module doc).

    Args:
      model: a built Keras 3 Functional model or keras.Sequential.
      devices: N, or the names of the N devices.
      memory_per_device: the cap: '16GiB', '512MiB', '1.5GB' or a number of bytes.
      batch_size: the global batch of a training step.
      **restrictions: see the module doc.

    Raises:
      ValueError: bad input, or no candidate fits; one line (for the latter: the smallest
        memory per device any candidate needs, and that candidate).
    """
    _CheckNames(restrictions, WHERE)
    _CheckCosts(restrictions.get("costs", "auto"))
    if memory_per_device is None or batch_size is None or devices is None:
        raise ValueError(
            f"{WHERE}: expected devices, memory_per_device and batch_size, received "
            f"devices={devices!r}, memory_per_device={memory_per_device!r}, "
            f"batch_size={batch_size!r}"
        )
    cap = _Cap(memory_per_device, WHERE)
    if not _PositiveInt(batch_size):
        raise ValueError(f"{WHERE}: expected batch_size >= 1, received batch_size={batch_size!r}")
    n, names = _Devices(devices, WHERE)
    graph = graph_lib.Trace(model, WHERE)
    candidates = _Candidates(n, len(graph.nodes), batch_size, restrictions, WHERE)
    if not candidates:
        raise ValueError(
            f"{WHERE}: no configuration applies to batch_size={batch_size} on {n} device(s) "
            f"under {restrictions or 'no restrictions'} (M micro-batches at most the batch, "
            f"K stages at most the model's {len(graph.nodes)} layer calls)"
        )
    slots, update, note = _Optimizer(model, restrictions.get("optimizer"))
    traced = graph_memory.TraceNodes(graph, WHERE)
    memory = graph_memory.GraphMemory(graph, traced, slots, update)

    def MemoryFn(c: planner.Candidate) -> list[int]:
        sched = generators.Make(c.schedule, c.num_stages, c.num_micro_batches, c.num_virtual_stages)
        nodes = [list(range(a, b)) for a, b in partition.Boundaries(list(c.partition))]
        return [m.total for m in memory.PerDevice(nodes, sched, c.remat, batch_size)]

    rates = restrictions.get("rates") or planner.MeasuredLater(names[0] if names else None)
    # What fits does not depend on the times: profile only where something fits.
    memory_fn, flop_costs = planner.CachedMemory(MemoryFn), ModelCosts(graph)
    result = planner.Search(flop_costs, rates, n, cap, batch_size, memory_fn, candidates)
    costs_note = ""
    if result.chosen is not None:
        costs, costs_note = PlanCosts(
            graph, candidates, batch_size, cap, restrictions.get("costs", "auto"),
            names[0] if names else None, flop_costs,
        )  # fmt: skip
        if costs is not flop_costs:
            result = planner.Search(costs, rates, n, cap, batch_size, memory_fn, candidates)
    if result.chosen is None:
        least = min(result.refused, key=lambda r: max(r.candidate.peak_bytes))
        need = report.Bytes(max(least.candidate.peak_bytes))
        raise ValueError(
            f"{WHERE}: memory_per_device={report.Bytes(cap)}: no plan of {model.name!r} on {n} "
            f"device(s) fits; the smallest needs {need} per device ({least.candidate.Describe()})"
        )
    return KerasPlan(
        knobs=Knobs(result.chosen),
        chosen=result.chosen,
        runners_up=result.runners_up,
        refused=result.refused,
        model_name=model.name,
        num_nodes=len(graph.nodes),
        num_devices=n,
        devices=names,
        memory_per_device=cap,
        batch_size=batch_size,
        searched=result.searched,
        note=note,
        costs_note=costs_note,
    )


def _Cap(size: Any, where: str) -> int:
    """`size` in bytes (lingpipe.plan.ParseSize), errors as one line naming `where`."""
    if isinstance(size, bool) or not isinstance(size, (int, str)):
        raise ValueError(
            f"{where}: memory_per_device={size!r}: expected a positive size such as 16GiB, "
            f"512MiB, 1.5GB or a number of bytes"
        )
    try:
        return plan_lib.ParseSize(str(size), "memory_per_device")
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def ResolveArgs(
    model: Any,
    plan: Any,
    knobs: dict,
    given: Sequence[str],
    memory_per_device: Any,
    batch_size: Any,
    where: str,
) -> dict:
    """Pipeline's arguments under `plan`: a KerasPlan's knobs, or "auto" planned here
    (explicit num_stages, num_micro_batches, schedule and remat become restrictions of
    the search; devices, when given, are the devices planned for). A knob in `given`
    (passed explicitly) wins over the plan's, with a one-line warning."""
    if isinstance(plan, str) and plan == "auto":
        if memory_per_device is None or batch_size is None:
            raise ValueError(
                f"{where}: plan='auto' needs memory_per_device (e.g. '16GiB') and batch_size, "
                f"received memory_per_device={memory_per_device!r}, batch_size={batch_size!r}"
            )
        from lingpipe import cluster

        restrict = {k: knobs[k] for k in ("num_stages", "num_micro_batches") if k in given}
        if "remat" in given and isinstance(knobs["remat"], str):
            restrict["remat"] = knobs["remat"]
        if "schedule" in given:
            restrict["schedules"] = knobs["schedule"]
        devices = knobs["devices"] or len(cluster.AvailableDevices())
        plan = Plan(model, devices, memory_per_device, batch_size, **restrict)
    elif plan is None:
        raise ValueError(
            f"{where}: memory_per_device and batch_size are for plan='auto', received "
            f"plan=None, memory_per_device={memory_per_device!r}, batch_size={batch_size!r}"
        )
    elif not isinstance(plan, KerasPlan):
        raise ValueError(
            f"{where}: expected plan to be a lingpipe.keras.Plan(...) result or 'auto', "
            f"received {type(plan).__name__} {plan!r:.60}"
        )
    elif memory_per_device is not None or batch_size is not None:
        raise ValueError(
            f"{where}: memory_per_device and batch_size are for plan='auto'; this plan was "
            f"made for {report.Bytes(plan.memory_per_device)} and batch {plan.batch_size}"
        )
    plan.CheckModel(graph_lib.Trace(model, where), where)
    given = [k for k in knobs if k in given]
    out = dict(knobs, **plan.knobs)
    for k in given:
        if k in plan.knobs and knobs[k] != plan.knobs[k]:
            warnings.warn(
                f"{where}: {k}={knobs[k]!r} given explicitly overrides the plan's "
                f"{plan.knobs[k]!r}; the plan's predictions no longer hold",
                stacklevel=4,
            )
        out[k] = knobs[k]
    if "split_points" in given:
        out["partition"] = knobs["partition"]
    elif "partition" not in given and _StagesChanged(knobs, plan.knobs, given):
        # The plan's counts cut its own stages; another number of stages is cut by cost.
        out["partition"] = "flops"
        warnings.warn(
            f"{where}: the plan's partition {plan.knobs['partition']} gives way to "
            "partition='flops': the stages given explicitly are not the plan's",
            stacklevel=4,
        )
    # The devices: those given (or the plan's names), the first of them for K stages.
    pool = knobs["devices"] if "devices" in given else plan.devices
    if pool is not None:
        out["devices"] = list(pool)[: out["num_stages"]]
    return out


def _StagesChanged(knobs: dict, planned: dict, given: Sequence[str]) -> bool:
    """Whether a knob given explicitly changes what the stages are (their number: the
    devices', a schedule's stages per device, the virtual stages)."""
    changes = ("num_stages", "schedule", "num_virtual_stages")
    return any(k in given and knobs[k] != planned.get(k) for k in changes)


def RecordsGivenArguments(init: Callable) -> Callable:
    """Decorates a constructor so that, while it runs, `self._given_arguments` holds the
    names of the arguments its caller passed (explicitly, defaults or not): a knob given
    beside plan= wins over the plan's."""
    signature = inspect.signature(init)

    @functools.wraps(init)
    def Init(self: Any, *args: Any, **kwargs: Any) -> None:
        given = frozenset(signature.bind(self, *args, **kwargs).arguments)
        object.__setattr__(self, "_given_arguments", given)
        init(self, *args, **kwargs)

    return Init
