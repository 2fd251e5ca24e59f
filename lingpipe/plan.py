"""python -m lingpipe.plan: how to run a registered model on N devices under a memory cap.

    python -m lingpipe.plan --model=lm.TransformerLmTiny --devices=2 --memory_per_device=64MiB
    python -m lingpipe.plan --model=lm.TransformerLmTiny --devices=2 \\
        --memory_per_device=64MiB --global_batch=64 --json=plan.json --verify=2

It searches N devices as R replicas x K stages, M micro-batches, the schedule (and its
stages per device), the recompute policy and the partition (lingpipe.pipeline.planning.planner),
and prints one screen: the chosen plan as the trainer flags to pass, with its predicted
step time and peak memory per device; the runners-up; why the rest were refused; the
costs it used. The model is never built whole, nor once per candidate: each cell's
FLOPs and shapes come from its FPropMeta, its memory from lingpipe.pipeline.observe.memory's
estimate, the device's rates are measured here once, and each cell's forward, inputs'
gradient and weights' gradient are profiled once, alone, at the smallest and largest
micro-batch any candidate runs (lingpipe.pipeline.planning.cell_times).

  --costs=auto  (default) the profiled times where the largest cell can be profiled on
                this device (3 x its weights and 4 x its outputs at the largest
                micro-batch fit this host's available memory, or the cap on an
                accelerator), else FLOPs at the measured rate; --costs=profile or
                --costs=flops forces one
  --calibrate[=STEPS]  also builds the fastest predicted pipeline (K >= 2) of the task
                and its 1F1B twin at another number of micro-batches
                (planner.CalibrationProbes), times STEPS (default 3) training steps of
                each and records them with the timeline, fits the cost model to them
                (lingpipe.pipeline.planning.calibrate: the devices' scale, the fixed
                cost per action and per step) and plans again with the fitted costs

  --num_stages, --num_micro_batches, --schedule, --remat  search only these values, each
                one or several, comma-separated (--num_stages=1,2 --schedule=1f1b,zbv),
                as the trainer's flags of the same names restrict its --plan=auto
  --json=FILE   {"for": {"model", "devices", "global_batch", "memory_per_device"}, "plan":
                {flag: value}, "predicted": {"step_seconds", "peak_bytes": [per device]},
                "candidates": [...]}: what the trainer's --plan=FILE reads
  --verify=N    trains the top N plans for a few steps, each in its own process (the
                trainer with --plan=FILE), and prints predicted against measured step
                time: the median of the steps the trainer times against its plan
                (plan_check.json), and each device's peak where each has an allocator
                of its own (GPUs). Also in the JSON's "verify".

Bad input (an unparseable SIZE, --devices=0, an unknown model, --calibrate=0,
--costs=profile for a cell too big to profile) and a cap too small for every candidate
are one line and exit status 2; the latter names the smallest memory per
device any candidate needs, and that candidate.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Any

from lingpipe import command_line
from lingpipe.pipeline.step import settings

__all__ = [
    "Calibrate",
    "ChooseCosts",
    "DeviceBytes",
    "Json",
    "main",
    "MedianSeconds",
    "ParseSize",
    "Plan",
    "PlanError",
    "Predicted",
    "ProfileNeed",
    "RegisteredModel",
    "Screen",
    "Verify",
]

_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_UNITS.update({"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12})


class PlanError(ValueError):
    """Bad input or no plan: one line for the user, exit status 2."""


def ParseSize(text: str, flag: str = "--memory_per_device") -> int:
    """'16GiB', '512MiB', '1.5GB' or a number of bytes -> bytes."""
    found = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = found.group(2).lower() if found else None
    if not found or unit not in _UNITS or float(found.group(1)) <= 0:
        raise PlanError(
            f"{flag}={text}: expected a positive size such as 16GiB, 512MiB, 1.5GB or a "
            f"number of bytes"
        )
    return int(float(found.group(1)) * _UNITS[unit])


def _Mib(num_bytes: float) -> str:
    from lingpipe.pipeline.planning import report  # with TensorFlow: not for --help

    return report.Bytes(num_bytes)


class RegisteredModel:
    """A registered task's pipeline, as the planner sees it: costs per cell, and the memory
    estimate of a candidate (its TraceCells cached per micro-batch size)."""

    def __init__(self, name: str, global_batch: int | None, params: Any = None) -> None:
        """`params`: the task's params as a run changed them (default: the registered)."""
        from lingpipe import model_registry

        try:
            self.params = (
                params.Copy() if params is not None else model_registry.GetParams(name, "Train")
            )
        except Exception as e:  # the registry's own one-line message
            raise PlanError(f"--model={name}: {e}") from None
        p = self.params
        if not hasattr(p.cls, "PipelineParams") or "num_stages" not in p:
            raise PlanError(
                f"--model={name}: expected a task with a pipeline (num_stages and a "
                f"PipelineParams classmethod), received {p.cls.__name__}"
            )
        self.name = name
        self.global_batch = global_batch or p.input.batch_size
        self._traced: dict = {}

    def _PipelineParams(self, batch: int, **knobs: Any) -> Any:
        p = self.params.Copy()
        p.input.batch_size = batch
        p.Set(**knobs)
        return p.cls.PipelineParams(p)

    def Costs(self) -> Any:
        """Per example: each cell's FLOPs, output bytes and weight bytes (planner.ModelCosts)."""
        from lingpipe.pipeline.planning import costs, planner

        pipe_p = self._PipelineParams(1, partition="flops")
        metas = costs.CellMetas(pipe_p, pipe_p.cell_tpl, tuple(pipe_p.input_shapes))
        return planner.ModelCosts(
            flops=tuple(float(m.flops) for m in metas),
            out_bytes=tuple(costs.ShapeBytes(m.out_shapes) for m in metas),
            weight_bytes=tuple(4 * int(m.num_params) for m in metas),
            weight_counts=costs.WeightCounts(pipe_p, pipe_p.cell_tpl),
        )

    def Profiled(self, flop_costs: Any, sizes: list[int]) -> Any:
        """`flop_costs` with each cell's times profiled at micro-batches of `sizes`
        (cell_times.Profile: each cell built once, alone)."""
        from lingpipe.pipeline.planning import cell_times

        pipe_p = self._PipelineParams(self.global_batch)
        times = cell_times.Profile(
            pipe_p, pipe_p.cell_tpl, tuple(pipe_p.input_shapes), sizes,
            partner=cell_times.Partner(),
        )  # fmt: skip
        return dataclasses.replace(flop_costs, times=times)

    def TrainStep(self, c: Any, batch: int) -> tuple[Any, Any]:
        """(a tf.function running one training step of the task as candidate `c` sets its
        pipeline, on a batch of `batch` from its input; the task's PipeliningLayer)."""
        import tensorflow as tf

        p = self.params.Copy()
        p.input.batch_size = batch
        p.Set(**c.Settings())
        task = p.Instantiate()
        task.CreateOptimizer()
        data = next(iter(task.CreateInputGenerator().Batches(1)))
        data = tf.nest.map_structure(tf.convert_to_tensor, data)
        step = tf.function(lambda: task.TrainStep(data, 0).loss[0], autograph=False)
        return step, task.pipeline

    def Memory(self, c: Any) -> list[int]:
        """Bytes per device of one pipeline of candidate `c` in a training step: replica
        0's, whose devices also average the replicas' gradients (the most loaded)."""
        from lingpipe.pipeline.observe import memory
        from lingpipe.pipeline.planning import partition
        from lingpipe.pipeline.schedules import generators
        from lingpipe.pipeline.step import remat

        batch = self.global_batch // c.replicas
        pipe_p = self._PipelineParams(batch, **c.Settings())
        sched = generators.Make(c.schedule, c.num_stages, c.num_micro_batches, c.num_virtual_stages)
        key = (batch, c.num_micro_batches)
        if key not in self._traced:
            self._traced[key] = memory.TracedFor(
                pipe_p, pipe_p.cell_tpl, tuple(pipe_p.input_shapes), c.num_micro_batches
            )
        bounds = [list(range(a, b)) for a, b in partition.Boundaries(list(c.partition))]
        stages = memory.Estimate(
            pipe_p,
            pipe_p.cell_tpl,
            bounds,
            tuple(pipe_p.input_shapes),
            sched,
            remat.Kept(sched, c.remat),
            self.params.train.optimizer,
            traced=self._traced[key],
            replicas=c.replicas,
        )
        per_device = [[] for _ in range(c.num_stages)]
        for s, stage in enumerate(stages):
            per_device[sched.stage_devices[s]].append(stage)
        return [memory.DeviceMemory(ms).total for ms in per_device]


def ProfileNeed(costs: Any, largest: int) -> int:
    """Bytes to profile the largest cell alone: its weights three times (weights,
    gradient, a copy) and its outputs four times, at `largest` examples."""
    return max(3 * w + 4 * o * largest for w, o in zip(costs.weight_bytes, costs.out_bytes))


def DeviceBytes(memory_per_device: int) -> tuple[int, str]:
    """(bytes, what they are) that a profile may use on this process's device: an
    accelerator's cap (the memory per device the plan is for), else the host's
    available memory."""
    import tensorflow as tf

    if tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"):
        return memory_per_device, "the cap per device"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "this host's available memory"
    except OSError:
        pass
    pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(pages), "this host's free memory"


def ChooseCosts(
    model: RegisteredModel, flop_costs: Any, candidates: list, memory_per_device: int, source: str
) -> tuple[Any, str]:
    """(costs, a line saying which) for `source` 'auto', 'profile' or 'flops' (module doc);
    the profile at the smallest and largest micro-batch of `candidates`."""
    if source == "flops":
        return flop_costs, "FLOPs at the measured rate (--costs=flops)"
    micro = sorted({model.global_batch // c.replicas // c.num_micro_batches for c in candidates})
    sizes = sorted({max(1, micro[0]), max(1, micro[-1])})
    need = ProfileNeed(flop_costs, sizes[-1])
    have, what = DeviceBytes(memory_per_device)
    if need > have:
        if source == "profile":
            raise PlanError(
                f"--costs=profile: profiling the largest cell of {model.name} needs "
                f"{_Mib(need)}, {what} is {_Mib(have)}; use --costs=flops (or auto)"
            )
        return flop_costs, (
            f"FLOPs at the measured rate (profiling the largest cell needs {_Mib(need)}, "
            f"{what} is {_Mib(have)})"
        )
    sizes_text = " and ".join(map(str, sizes))
    return model.Profiled(flop_costs, sizes), (
        f"profiled per cell here (F, I, W at micro-batches of {sizes_text})"
    )


def Plan(
    model: RegisteredModel,
    num_devices: int,
    memory_per_device: int,
    rates: Any,
    restrict: dict | None = None,
    costs: Any = "auto",
) -> Any:
    """planner.Search over the model; PlanError when nothing fits (module doc).

    `restrict`: planner.Candidates' keywords (stages, micro_batches, schedules, remats).
    `costs`: 'auto', 'profile' or 'flops' (ChooseCosts), or a planner.ModelCosts.
    `rates`: planner.Rates, or a function that measures them, called once a candidate
    fits (a cap too small is refused without them).
    The result's `costs_note` says which costs were used.
    """
    from lingpipe.pipeline.planning import planner

    flop_costs = model.Costs() if isinstance(costs, str) else costs
    candidates = planner.Candidates(
        num_devices, len(flop_costs.flops), model.global_batch, **(restrict or {})
    )
    if not candidates:
        raise PlanError(
            f"--devices={num_devices} --global_batch={model.global_batch}: no configuration "
            f"applies (R replicas must divide the global batch, K stages at most "
            f"{len(flop_costs.flops)} cells of {model.name}"
            + (f", and {_Restricted(restrict)}" if restrict else "")
            + ")"
        )
    note = "given"

    memory = planner.CachedMemory(model.Memory)

    def Search(costs: Any) -> Any:
        return planner.Search(
            costs, rates, num_devices, memory_per_device, model.global_batch, memory, candidates
        )

    result = Search(flop_costs)  # what fits does not depend on the times: no profile yet
    if isinstance(costs, str) and result.chosen is not None:
        costs, note = ChooseCosts(model, flop_costs, candidates, memory_per_device, costs)
        if costs is not flop_costs:
            result = Search(costs)
    result.costs = costs
    result.costs_note = note
    if result.chosen is None:
        least = min(result.refused, key=lambda r: max(r.candidate.peak_bytes))
        need = max(least.candidate.peak_bytes)
        raise PlanError(
            f"--memory_per_device={_Mib(memory_per_device)}: no plan of {model.name} on "
            f"{num_devices} device(s) fits; the smallest needs {_Mib(need)} per device "
            f"({least.candidate.Describe()})"
        )
    return result


def _Restricted(restrict: dict) -> str:
    return ", ".join(f"{k} in {list(v)}" for k, v in restrict.items())


def Calibrate(
    model: RegisteredModel, result: Any, rates: Any, num_devices: int, steps: int
) -> tuple[Any, Any, Any, str]:
    """(costs, rates, the calibrate.Calibration, a line) fitted to `steps` recorded
    training steps of the fastest predicted pipeline of `result` (K >= 2; one replica
    of it), module doc. Raises PlanError when no pipeline fits."""
    from lingpipe.pipeline.planning import calibrate, planner

    pipelines = [c for c in result.ranked if c.num_stages > 1]
    if not pipelines:
        raise PlanError(
            f"--calibrate: no pipeline (K >= 2) of {model.name} on {num_devices} device(s) "
            "fits the cap, so there is none to calibrate on; plan without --calibrate"
        )
    batch = model.global_batch // pipelines[0].replicas
    from lingpipe.pipeline.observe import timeline

    probes, timed = [], []
    for c in planner.CalibrationProbes(pipelines[0], result.costs, model.global_batch):
        step, pipeline = model.TrainStep(c, batch)
        unprofiled = MedianSeconds(step, steps)
        with tempfile.TemporaryDirectory() as logdir:
            spans = timeline.Record(step, logdir, pipeline, num_steps=steps)
        compute = planner.Compute(c, result.costs, rates, batch)
        makespan = max(unprofiled - planner.OutsideSeconds(c, result.costs, rates), 1e-9)
        probes.append(calibrate.Probe(spans, pipeline.Schedule(), compute, makespan))
        timed.append(f"{c.Describe()} ({unprofiled * 1e3:.1f} ms)")
    cal = calibrate.FitProbes(probes)
    costs, cal_rates = planner.Calibrated(result.costs, rates, cal)
    line = (
        f"calibrated on {steps} step(s) each of {'; '.join(timed)}: cells x{cal.scale:.2f}, "
        f"{cal.action_s * 1e3:.2f} ms per action, {cal.step_s * 1e3:.2f} ms per step"
    )
    return costs, cal_rates, cal, line


def MedianSeconds(step: Any, steps: int) -> float:
    """The median seconds of `steps` calls of `step` (its results read back), after one
    untimed call that traces it."""
    import time

    import tensorflow as tf

    tf.nest.map_structure(lambda t: t.numpy(), step())  # trace
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        tf.nest.map_structure(lambda t: t.numpy(), step())
        seconds.append(time.perf_counter() - start)
    return sorted(seconds)[len(seconds) // 2]


def _CommandLine(model: str, flags: dict) -> str:
    parts = [f"python -m lingpipe.trainer --model={model}"]
    for k, v in flags.items():
        text = settings.FlagText(v)
        parts.append(f"--{k}='{text}'" if " " in text or ";" in text else f"--{k}={text}")
    return " ".join(parts)


def Screen(model: RegisteredModel, result: Any, memory_per_device: int) -> str:
    from lingpipe.pipeline.planning import report

    c = result.chosen
    pipelined = "no pipeline" if c.num_stages == 1 else f"{c.num_stages} stages"
    return report.PlanScreen(
        f"plan for {model.name}, global batch {model.global_batch}, cap "
        f"{_Mib(memory_per_device)} per device ({result.searched} candidates):",
        c,
        f"{pipelined}, {c.replicas} replica(s)",
        _CommandLine(model.name, c.Flags()),
        result.runners_up,
        result.refused,
        notes=[f"costs: {result.costs_note or 'given'}"],
    )


def Predicted(c: Any) -> dict:
    """A planned candidate's prediction as plan files hold it: its step seconds and peak
    bytes per device."""
    return {"step_seconds": c.step_seconds, "peak_bytes": list(c.peak_bytes)}


def Json(result: Any, model: RegisteredModel, num_devices: int, memory_per_device: int) -> dict:
    """What --json writes; "for" says what the plan was made for (the trainer's --plan
    refuses a plan for another model or for more devices than it has)."""
    c = result.chosen

    def Entry(x: Any) -> dict:
        return dict(flags=x.Flags(), **Predicted(x))

    return {
        "for": {
            "model": model.name,
            "devices": num_devices,
            "global_batch": model.global_batch,
            "memory_per_device": memory_per_device,
        },
        "plan": c.Flags(),
        "predicted": Predicted(c),
        "candidates": [Entry(x) for x in [c, *result.runners_up]],
        "refused": [
            dict(flags=r.candidate.Flags(), device=r.device, excess_bytes=r.excess_bytes)
            for r in result.refused
        ],
    }


def Verify(made_for: dict, plans: list, steps: int = 12) -> list[tuple[float, dict | str]]:
    """(predicted step seconds, the trainer's plan_check.json "measured", or where it
    wrote none the last line it printed) of each plan, each trained `steps` steps by the
    trainer in its own process with --plan=FILE:
    the step times and peaks the trainer measures against its plan (runners/plan_flags:
    up to 10 steps after the first), the same quantity as the prediction. `made_for`:
    Json's "for"."""
    out = []
    for c in plans:
        with tempfile.TemporaryDirectory() as logdir:
            path = os.path.join(logdir, "plan.json")
            with open(path, "w") as f:
                json.dump({"for": made_for, "plan": c.Flags(), "predicted": Predicted(c)}, f)
            cmd = [sys.executable, "-m", "lingpipe.trainer", f"--model={made_for['model']}"]
            cmd += [f"--logdir={logdir}", f"--max_steps={steps}", f"--plan={path}"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            check = os.path.join(logdir, "plan_check.json")
            lines = [x for x in (done.stderr + done.stdout).splitlines() if x.strip()]
            measured: dict | str = lines[-1].strip() if lines else f"exit status {done.returncode}"
            if os.path.exists(check):
                with open(check) as f:
                    measured = json.load(f).get("measured") or measured
        out.append((c.step_seconds, measured))
    return out


def _VerifyLine(predicted: float, measured: dict | str, c: Any) -> str:
    """One plan's line of --verify: predicted against measured step, and each device's
    peak where each has an allocator of its own; or the trainer's last line."""
    head = f"  {predicted * 1e3:8.1f} ms / "
    if isinstance(measured, str):
        return f"{head}the trainer measured nothing ({measured[:200]})  {c.Describe()}"
    seconds = measured["step_seconds"]
    head += f"{seconds * 1e3:8.1f} ms ({(predicted - seconds) / seconds * 100:+.0f}%)"
    peaks = measured.get("peak_bytes") or []
    own = not any("one allocator" in a for a in measured.get("allocators", []))
    if own and len(peaks) == len(c.peak_bytes):
        head += "  peaks " + ", ".join(
            f"{_Mib(p)} / {_Mib(m)}" for p, m in zip(c.peak_bytes, peaks)
        )
    return f"{head}  {c.Describe()}"


def _CalibrateSteps(text: str | None) -> int:
    if text is None:
        return 0
    if not text.isdigit() or int(text) < 1:
        raise PlanError(f"--calibrate={text}: expected a number of steps >= 1 (or no value: 3)")
    return int(text)


# The search's restrictions on the command line: flag -> planner.Candidates' keyword.
RESTRICTION_FLAGS = dict(
    num_stages="stages", num_micro_batches="micro_batches", schedule="schedules", remat="remats"
)


def Restrictions(args: Any) -> dict:
    """planner.Candidates' restrictions from the RESTRICTION_FLAGS given (module doc)."""
    from lingpipe.pipeline.planning import planner

    out: dict = {}
    for flag, keyword in RESTRICTION_FLAGS.items():
        text = getattr(args, flag)
        if text is None:
            continue
        values = [v.strip() for v in text.split(",")]
        if flag == "schedule":
            known = dict.fromkeys(name for name, _ in planner.SCHEDULES)
            if any(v not in known for v in values):
                raise PlanError(f"--schedule={text}: expected one or more of {', '.join(known)}")
            out[keyword] = list(planner.SchedulesNamed(values))
        elif flag == "remat":
            if any(v not in planner.REMAT for v in values):
                raise PlanError(
                    f"--remat={text}: expected one or more of {', '.join(planner.REMAT)}"
                )
            out[keyword] = values
        else:
            if not all(v.isdigit() and int(v) >= 1 for v in values):
                raise PlanError(f"--{flag}={text}: expected numbers >= 1, comma-separated")
            out[keyword] = [int(v) for v in values]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = command_line.ArgumentParser(
        "lingpipe.plan", error_prefix="lingpipe.plan:", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--model", required=True, help="a registered model (lm.TransformerLmTiny)")
    ap.add_argument("--devices", type=int, required=True, help="devices to use (N)")
    ap.add_argument("--memory_per_device", required=True, help="16GiB, 512MiB or bytes")
    ap.add_argument("--global_batch", type=int, default=None, help="default: the model's")
    ap.add_argument("--json", default=None, help="write the plan and candidates here")
    ap.add_argument("--verify", type=int, default=0, help="train the top N plans and compare")
    ap.add_argument(
        "--costs", default="auto", help="auto (profile where it fits), profile or flops"
    )
    for flag in RESTRICTION_FLAGS:
        ap.add_argument(f"--{flag}", default=None, help="search only these (comma-separated)")
    ap.add_argument(
        "--calibrate",
        nargs="?",
        const="3",
        default=None,
        help="fit the costs to STEPS (default 3) recorded steps of the best pipeline",
    )
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    try:
        if args.devices < 1:
            raise PlanError(f"--devices={args.devices}: expected a number of devices >= 1")
        if args.verify < 0:
            raise PlanError(f"--verify={args.verify}: expected a number of plans to train >= 0")
        if args.global_batch is not None and args.global_batch < 1:
            raise PlanError(f"--global_batch={args.global_batch}: expected a batch size >= 1")
        cap = ParseSize(args.memory_per_device)
        if args.costs not in ("auto", "profile", "flops"):
            raise PlanError(f"--costs={args.costs}: expected auto, profile or flops")
        steps = _CalibrateSteps(args.calibrate)
        restrict = Restrictions(args)  # before TensorFlow starts: bad flags are refused at once
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        from lingpipe import cluster

        if args.devices > 1:
            cluster.SetLogicalCpuDevices(args.devices)  # without accelerators: CPU devices
        from lingpipe.pipeline.planning import planner

        model = RegisteredModel(args.model, args.global_batch)
        rates = planner.MeasuredLater()
        result = Plan(model, args.devices, cap, rates, restrict, costs=args.costs)
        if steps:
            first = result.costs_note
            costs, rates, _, line = Calibrate(model, result, rates(), args.devices, steps)
            result = Plan(model, args.devices, cap, rates, restrict, costs=costs)
            result.costs_note = f"{first}; {line}"
    except PlanError as e:
        print(f"lingpipe.plan: {e}", file=sys.stderr)
        return 2
    print(Screen(model, result, cap))
    written = Json(result, model, args.devices, cap)
    if args.verify:
        plans = [result.chosen, *result.runners_up][: args.verify]
        print("verify: predicted / measured step time (the trainer's plan_check.json)")
        written["verify"] = []
        for c, (pred, meas) in zip(plans, Verify(written["for"], plans)):
            print(_VerifyLine(pred, meas, c))
            ok = isinstance(meas, dict)
            written["verify"].append(
                dict(flags=c.Flags(), predicted_seconds=pred, measured=meas if ok else None,
                     measured_seconds=meas["step_seconds"] if ok else None,
                     **({} if ok else {"error": meas}))
            )  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(written, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
