"""The trainer's --plan: a plan's pipeline flags in place of the flags not given, and a
check of its predictions against the run (plan_check.json).

    python -m lingpipe.trainer --model=lm.TransformerLmTiny --logdir=/tmp/lp \\
        --plan=auto --memory_per_device=64MiB
    python -m lingpipe.plan --model=lm.TransformerLmTiny --devices=2 \\
        --memory_per_device=64MiB --json=plan.json
    python -m lingpipe.trainer --model=lm.TransformerLmTiny --logdir=/tmp/lp --plan=plan.json

--plan=auto plans for this run's params on its devices: --logical_devices, else the
accelerators, else the task's num_stages (--num_stages); R replicas x K stages of them,
or one replica of --num_stages under an explicit --strategy=default. The pipeline flags
given on the command line narrow the search (stages, micro-batches, schedule, remat).
--plan=FILE reads the JSON that `python -m lingpipe.plan --json` writes; it must have
been written for this --model and for no more devices than this run has. Either way a
flag given on the command line wins over the plan's value, and the log says so, one
line per flag.

After the run's first step (which traces) and up to MEASURED_STEPS more, the chief
writes LOGDIR/plan_check.json, {"predicted": {"step_seconds", "peak_bytes"},
"measured": {"step_seconds", "peak_bytes", "allocators", "steps"}}, and logs
`plan: predicted 41 ms and 212 MiB per device; measured 44 ms (+7%)`. The measured
peaks are per device where each has its own allocator (GPUs); on CPU one allocator
serves every logical device, and "allocators" says so beside its one total.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from absl import logging

from lingpipe.pipeline.step import settings
from lingpipe.runners import startup

__all__ = [
    "Apply",
    "Auto",
    "CHECK_FILE",
    "CheckDevices",
    "CheckFlags",
    "DefineFlags",
    "FLAGS",
    "FlagText",
    "MEASURED_STEPS",
    "PLAN_FLAGS",
    "PlanCheck",
    "Prepare",
    "ReadPlan",
    "Restrictions",
]

CHECK_FILE = "plan_check.json"
MEASURED_STEPS = 10
# What a plan may set: the pipeline settings' flags, the replicas' strategy and devices,
# and (plans written before the settings had flags) a params_override.
PLAN_FLAGS = (*settings.FLAGS, "strategy", "logical_devices")


FLAGS = ("plan", "memory_per_device")  # the trainer's flags defined here


def DefineFlags(flags: Any) -> None:
    flags.DEFINE_string(
        "plan",
        None,
        "auto: plan the pipeline flags for this run's devices under --memory_per_device "
        "(python -m lingpipe.plan's search); or the JSON file that python -m lingpipe.plan "
        "--json wrote for this --model. Flags given on the command line win over the plan's. "
        "Writes LOGDIR/plan_check.json: predicted against measured step time and memory.",
    )
    flags.DEFINE_string(
        "memory_per_device",
        None,
        "--plan=auto: the memory cap per device, as 16GiB, 512MiB or a number of bytes.",
    )


FlagText = settings.FlagText  # a plan's value as its flag's text: lists as 'a,b'


def CheckFlags(flags: Any) -> dict | None:
    """--plan and --memory_per_device, checked before TensorFlow is imported. Returns the
    plan file's JSON (None for --plan=auto or no plan).

    Raises:
      startup.UsageError: --plan=auto without --memory_per_device, an unparseable SIZE,
        --memory_per_device without --plan=auto, an unreadable or invalid plan file, or
        one written for another model.
    """
    from lingpipe import plan as plan_lib

    if flags.plan is None:
        if flags.memory_per_device is not None:
            raise startup.UsageError(
                f"--memory_per_device={flags.memory_per_device}: expected with --plan=auto "
                "only (a plan file carries the cap it was made for)"
            )
        return None
    if flags.plan == "auto":
        if flags.memory_per_device is None:
            raise startup.UsageError(
                "--plan=auto: expected --memory_per_device=SIZE (16GiB, 512MiB or a number "
                "of bytes), the memory cap the plan must fit"
            )
        try:
            plan_lib.ParseSize(flags.memory_per_device)
        except plan_lib.PlanError as e:
            raise startup.UsageError(str(e)) from None
        return None
    if flags.memory_per_device is not None:
        raise startup.UsageError(
            f"--memory_per_device={flags.memory_per_device}: expected with --plan=auto only, "
            f"received --plan={flags.plan} (a plan file carries the cap it was made for)"
        )
    return ReadPlan(flags.plan, flags.model)


def ReadPlan(path: str, model: str) -> dict:
    """The plan file at `path`, checked: JSON with "plan" (flags this module knows, each
    value one its setting takes), "predicted" and "for" naming `model`."""
    where = f"--plan={path}"
    try:
        with open(path) as f:
            written = json.load(f)
    except OSError as e:
        raise startup.UsageError(
            f"{where}: cannot read it ({e.strerror}); expected the JSON file of python -m "
            "lingpipe.plan --json, or auto"
        ) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise startup.UsageError(
            f"{where}: not JSON ({e}); expected the file of python -m lingpipe.plan --json"
        ) from None
    made_for = written.get("for") if isinstance(written, dict) else None
    plan = written.get("plan") if isinstance(written, dict) else None
    predicted = written.get("predicted") if isinstance(written, dict) else None
    if not (isinstance(plan, dict) and isinstance(predicted, dict) and isinstance(made_for, dict)):
        raise startup.UsageError(
            f'{where}: expected a JSON object with "plan", "predicted" and "for" (the '
            "model and devices it was made for), as python -m lingpipe.plan --json writes; "
            "received one with "
            + (
                ", ".join(map(repr, written))
                if isinstance(written, dict)
                else type(written).__name__
            )
        )
    if made_for.get("model") != model:
        raise startup.UsageError(
            f"{where}: written for --model={made_for.get('model')}, this run's is "
            f"--model={model}; plan it with python -m lingpipe.plan --model={model}"
        )
    devices = made_for.get("devices")
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise startup.UsageError(
            f'{where}: "for" gives devices={devices!r}; expected a number of devices >= 1'
        )
    for name, value in plan.items():
        _CheckPlanValue(where, name, value)
    return written


def _CheckPlanValue(where: str, name: str, value: Any) -> None:
    if name == "params_override":
        problem = None if isinstance(value, str) else f"expected text, received {value!r}"
    elif name == "strategy":
        problem = (
            None
            if value in ("default", "mirrored")
            else (f"expected default or mirrored, received {value!r}")
        )
    elif name == "logical_devices":
        problem = (
            None
            if isinstance(value, int) and value >= 1
            else (f"expected a positive integer, received {value!r}")
        )
    elif name in settings.FLAGS:
        problem = settings.Problem(name, value)
    else:
        problem = f"unknown flag; expected one of {', '.join(PLAN_FLAGS)} or params_override"
    if problem:
        raise startup.UsageError(f'{where}: "plan" gives {name}={value!r}: {problem}')


def CheckDevices(written: dict, path: str, available: int, where_from: str) -> None:
    """Refuses a plan for more devices than this run has (`available`, from `where_from`)."""
    wanted = written["for"]["devices"]
    if wanted > available:
        raise startup.UsageError(
            f"--plan={path}: written for {wanted} devices, this run has {available} "
            f"({where_from}); plan for {available} with python -m lingpipe.plan "
            f"--devices={available}"
        )


def Apply(flags: Any, plan: dict, source: str) -> None:
    """Sets each flag of `plan` that the command line did not give; one log line per flag
    the command line gives otherwise (it wins)."""
    for name, value in plan.items():
        if name == "params_override":  # the plan's first, the command line's after it
            given = flags.params_override
            flags.params_override = f"{value}; {given}" if given else value
            continue
        text = FlagText(value)
        if flags[name].present:
            given = flags[name].value
            if FlagText(given) != text:
                logging.info(
                    "plan: --%s=%s from the command line wins over %s's %s",
                    name,
                    FlagText(given),
                    source,
                    text,
                )
            continue
        flags[name].value = value if name in ("logical_devices",) else _FlagValue(name, value)


def _FlagValue(name: str, value: Any) -> Any:
    """`value` as its flag holds it: ints and bools as they are, the rest as text."""
    if name in settings.FLAGS and settings.Get(name).kind in ("int", "bool"):
        return value
    return FlagText(value)


def Restrictions(flags: Any) -> dict:
    """What the command line fixes, as planner.Candidates' restrictions."""
    from lingpipe.pipeline.planning import planner

    out: dict = {}
    if flags["num_stages"].present:
        out["stages"] = [flags.num_stages]
    if flags["num_micro_batches"].present:
        out["micro_batches"] = [flags.num_micro_batches]
    if flags["remat"].present and "," not in flags.remat and "[" not in flags.remat:
        out["remats"] = [flags.remat]
    if flags["schedule"].present:
        v = flags.num_virtual_stages if flags["num_virtual_stages"].present else None
        out["schedules"] = list(planner.SchedulesNamed([flags.schedule], v))
    return out


def Auto(resolved: startup.ResolvedParams, num_devices: int, cap_text: str, restrict: dict):
    """Plans `resolved`'s task on `num_devices` under the cap; returns plan.Json's dict.

    Raises:
      startup.UsageError: nothing fits (naming the smallest need and its candidate), or
        the task has no pipeline to plan.
    """
    from lingpipe import plan as plan_lib
    from lingpipe.pipeline.planning import planner

    try:
        cap = plan_lib.ParseSize(cap_text)
        model = plan_lib.RegisteredModel(resolved.key, None, params=resolved.task)
        rates = planner.MeasuredLater()
        result = plan_lib.Plan(model, num_devices, cap, rates, restrict)
    except plan_lib.PlanError as e:
        raise startup.UsageError(f"--plan=auto: {e}") from None
    written = plan_lib.Json(result, model, num_devices, cap)
    chosen = result.chosen
    logging.info(
        "plan: chose %s for %d device(s) under %s per device (%d candidates)",
        chosen.Describe(),
        num_devices,
        cap_text,
        result.searched,
    )
    return written


def _Ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.0f} ms" if ms >= 10 else f"{ms:.1f} ms"


def _MiB(num_bytes: float) -> str:
    mib = num_bytes / 2**20
    return f"{mib:.0f} MiB" if mib >= 10 else f"{mib:.1f} MiB"


class PlanCheck:
    """Times the steps after the run's first and writes LOGDIR/plan_check.json (module
    doc). The train loop calls Before(step) and After(step, last) around each step."""

    def __init__(self, logdir: str, predicted: dict, devices: list[str] | None) -> None:
        self._logdir = logdir
        self._predicted = dict(predicted)
        self._devices = devices  # whose peaks are read; None: not in this process
        self._first: int | None = None
        self._seconds: list[float] = []
        self._start = 0.0
        self._done = False

    def Before(self, step: int) -> None:
        if self._done:
            return
        if self._first is None:
            self._first = step
        elif step == self._first + 1 and self._devices:
            from lingpipe.pipeline.observe import memory

            memory.ResetPeaks(self._devices)
        self._start = time.perf_counter()

    def After(self, step: int, last: bool) -> None:
        if self._done or self._first is None:
            return
        if step > self._first:
            self._seconds.append(time.perf_counter() - self._start)
        if len(self._seconds) >= MEASURED_STEPS or last:
            self._done = True
            self._Write()

    def _Write(self) -> None:
        measured = None
        if self._seconds:
            measured = {
                "step_seconds": sorted(self._seconds)[len(self._seconds) // 2],  # the median
                "steps": len(self._seconds),
            }
            if self._devices:
                from lingpipe.pipeline.observe import memory

                peaks = memory.MeasuredPeaks(self._devices)
                measured["peak_bytes"] = list(peaks.values())
                measured["allocators"] = list(peaks)
        startup.WriteAtomically(
            f"{self._logdir}/{CHECK_FILE}",
            json.dumps({"predicted": self._predicted, "measured": measured}, indent=2) + "\n",
        )
        logging.info("%s", self.Line(measured))

    def Line(self, measured: dict | None) -> str:
        """`plan: predicted 41 ms and 212 MiB per device; measured 44 ms (+7%)`."""
        predicted_s = self._predicted["step_seconds"]
        peak = max(self._predicted.get("peak_bytes") or [0])
        head = f"plan: predicted {_Ms(predicted_s)} and {_MiB(peak)} per device"
        if measured is None:
            return f"{head}; not measured (the run had no step after its first, which traces)"
        # Rounded first: a step 0.4% faster than predicted is "+0%", not "-0%".
        error = round((measured["step_seconds"] - predicted_s) / predicted_s * 100)
        return f"{head}; measured {_Ms(measured['step_seconds'])} ({error:+d}%)"


def Prepare(
    flags: Any,
    resolved: startup.ResolvedParams,
    plan_file: dict | None,
    set_up_devices: Callable[[int], None],
    resolve: Callable[[], startup.ResolvedParams],
) -> tuple[startup.ResolvedParams, dict, bool]:
    """--plan, once TensorFlow is imported: the plan file's devices checked, or
    --plan=auto's plan made and its flags applied (the devices set up first with
    `set_up_devices(n)`: planning runs TensorFlow; the params then `resolve()`d again).

    Returns (the run's params, the plan's prediction, whether the devices are set up).
    """
    import tensorflow as tf

    from lingpipe import cluster

    accelerators = tf.config.list_physical_devices("GPU") or tf.config.list_physical_devices("TPU")
    if plan_file is not None:
        if flags.strategy in ("default", "mirrored"):  # the devices are this host's
            if accelerators:
                available, where = len(accelerators), "its accelerators"
            elif flags["logical_devices"].present and flags.logical_devices:
                available, where = flags.logical_devices, "--logical_devices"
            else:
                available, where = cluster.MAX_LOGICAL_CPU_DEVICES, "logical CPU devices at most"
            CheckDevices(plan_file, flags.plan, available, where)
        made_for, batch = plan_file["for"].get("global_batch"), resolved.task.input.batch_size
        if made_for not in (None, batch):
            logging.warning(
                "plan: %s was made for global batch %s, this run's is %d: its predictions "
                "are for the other batch",
                flags.plan,
                made_for,
                batch,
            )
        return resolved, plan_file["predicted"], False
    restrict = Restrictions(flags)
    one_replica = flags["strategy"].present and flags.strategy == "default"
    if one_replica and flags["num_stages"].present:
        num_devices, where = flags.num_stages, "--num_stages, one replica: --strategy=default"
    elif flags.logical_devices:
        num_devices, where = flags.logical_devices, "--logical_devices"
    elif accelerators:
        num_devices, where = len(accelerators), "the accelerators"
    else:
        num_devices = resolved.task.num_stages if "num_stages" in resolved.task else 1
        where = "the task's num_stages"
    if one_replica:
        restrict["stages"] = [num_devices]
    logging.info("plan: planning for %d device(s) (%s)", num_devices, where)
    set_up_devices(num_devices)
    written = Auto(resolved, num_devices, flags.memory_per_device, restrict)
    Apply(flags, written["plan"], "--plan=auto")
    return resolve(), written["predicted"], True
