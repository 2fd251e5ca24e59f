"""python -m lingpipe.plan: how to run a registered model on N devices under a memory cap.

    python -m lingpipe.plan --model=lm.TransformerLmTiny --devices=2 --memory_per_device=64MiB
    python -m lingpipe.plan --model=lm.TransformerLmTiny --devices=2 \\
        --memory_per_device=64MiB --global_batch=64 --json=plan.json --verify=2

It searches N devices as R replicas x K stages, M micro-batches, the schedule (and its
stages per device), the recompute policy and the partition (lingpipe.pipeline.planner),
and prints one screen: the chosen plan as the trainer flags to pass, with its predicted
step time and peak memory per device; the runners-up; why the rest were refused. The
model is never built: each cell's FLOPs and shapes come from its FPropMeta, its memory
from lingpipe.pipeline.memory's estimate, and the device's rates are measured here once.

  --json=FILE   {"for": {"model", "devices", "global_batch", "memory_per_device"}, "plan":
                {flag: value}, "predicted": {"step_seconds", "peak_bytes": [per device]},
                "candidates": [...]}: what the trainer's --plan=FILE reads
  --verify=N    trains the top N plans for a few steps, each in its own process, and
                prints predicted against measured step time (also in the JSON's
                "verify"). The measured time is the trainer's whole step (input and
                optimizer included) from its steps/s log.

Bad input (an unparseable SIZE, --devices=0, an unknown model) and a cap too small for
every candidate are one line and exit status 2; the latter names the smallest memory per
device any candidate needs, and that candidate.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Any

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
    if num_bytes < 2**20 / 10:  # a cap of a few KiB would read '0.0 MiB'
        return f"{num_bytes / 2**10:,.1f} KiB"
    return f"{num_bytes / 2**20:,.1f} MiB"


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
        from lingpipe.pipeline import costs, planner

        pipe_p = self._PipelineParams(1, partition="flops")
        metas = costs.CellMetas(pipe_p, pipe_p.cell_tpl, tuple(pipe_p.input_shapes))
        return planner.ModelCosts(
            flops=tuple(float(m.flops) for m in metas),
            out_bytes=tuple(costs.ShapeBytes(m.out_shapes) for m in metas),
            weight_bytes=tuple(4 * int(m.num_params) for m in metas),
        )

    def Memory(self, c: Any) -> list[int]:
        """Bytes per device of one pipeline of candidate `c` in a training step."""
        from lingpipe.pipeline import generators, memory, partition, remat

        batch = self.global_batch // c.replicas
        pipe_p = self._PipelineParams(
            batch,
            num_stages=c.num_stages,
            num_micro_batches=c.num_micro_batches,
            schedule=c.schedule,
            num_virtual_stages=c.num_virtual_stages,
            remat=c.remat,
            partition=list(c.partition),
        )
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
        )
        per_device = [[] for _ in range(c.num_stages)]
        for s, stage in enumerate(stages):
            per_device[sched.stage_devices[s]].append(stage)
        return [memory.DeviceMemory(ms).total for ms in per_device]


def Plan(
    model: RegisteredModel,
    num_devices: int,
    memory_per_device: int,
    rates: Any,
    restrict: dict | None = None,
) -> Any:
    """planner.Search over the model; PlanError when nothing fits (module doc).

    `restrict`: planner.Candidates' keywords (stages, micro_batches, schedules, remats).
    """
    from lingpipe.pipeline import planner

    costs = model.Costs()
    candidates = planner.Candidates(
        num_devices, len(costs.flops), model.global_batch, **(restrict or {})
    )
    if not candidates:
        raise PlanError(
            f"--devices={num_devices} --global_batch={model.global_batch}: no configuration "
            f"applies (R replicas must divide the global batch, K stages at most "
            f"{len(costs.flops)} cells of {model.name}"
            + (f", and {_Restricted(restrict)}" if restrict else "")
            + ")"
        )
    result = planner.Search(
        costs, rates, num_devices, memory_per_device, model.global_batch, model.Memory, candidates
    )
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


def PlanFlags(c: Any) -> dict[str, Any]:
    """The trainer's flags of candidate `c`: each pipeline setting it fixes (the partition
    as its counts per stage), and the strategy and devices of its replicas."""
    from lingpipe.pipeline import settings

    flags = {name: getattr(c, name) for name in settings.FLAGS if hasattr(c, name)}
    flags["partition"] = list(c.partition)
    if c.replicas > 1:
        flags["strategy"] = "mirrored"
        flags["logical_devices"] = c.replicas * c.num_stages
    return flags


def _FlagText(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def _CommandLine(model: str, flags: dict) -> str:
    parts = [f"python -m lingpipe.trainer --model={model}"]
    for k, v in flags.items():
        text = _FlagText(v)
        parts.append(f"--{k}='{text}'" if " " in text or ";" in text else f"--{k}={text}")
    return " ".join(parts)


def Screen(model: RegisteredModel, result: Any, memory_per_device: int) -> str:
    c = result.chosen
    pipelined = "no pipeline" if c.num_stages == 1 else f"{c.num_stages} stages"
    lines = [
        f"plan for {model.name}, global batch {model.global_batch}, cap "
        f"{_Mib(memory_per_device)} per device ({result.searched} candidates):",
        f"  {c.Describe()}  [{pipelined}, {c.replicas} replica(s)]",
        f"  predicted {c.step_seconds * 1e3:.1f} ms per step, peak per device "
        + ", ".join(_Mib(b) for b in c.peak_bytes),
        "  " + _CommandLine(model.name, PlanFlags(c)),
        "runners-up:",
    ]
    for r in result.runners_up:
        lines.append(f"  {r.step_seconds * 1e3:8.1f} ms  {r.Describe()}")
    lines.append(f"refused ({len(result.refused)}, over the cap):")
    for r in result.refused[:5]:
        lines.append(
            f"  device {r.device} over by {_Mib(r.excess_bytes)}  {r.candidate.Describe()}"
        )
    return "\n".join(lines)


def Json(result: Any, model: RegisteredModel, num_devices: int, memory_per_device: int) -> dict:
    """What --json writes; "for" says what the plan was made for (the trainer's --plan
    refuses a plan for another model or for more devices than it has)."""
    c = result.chosen

    def Entry(x: Any) -> dict:
        return dict(flags=PlanFlags(x), step_seconds=x.step_seconds, peak_bytes=list(x.peak_bytes))

    return {
        "for": {
            "model": model.name,
            "devices": num_devices,
            "global_batch": model.global_batch,
            "memory_per_device": memory_per_device,
        },
        "plan": PlanFlags(c),
        "predicted": {"step_seconds": c.step_seconds, "peak_bytes": list(c.peak_bytes)},
        "candidates": [Entry(x) for x in [c, *result.runners_up]],
        "refused": [
            dict(flags=PlanFlags(r.candidate), device=r.device, excess_bytes=r.excess_bytes)
            for r in result.refused
        ],
    }


def Verify(model: str, plans: list, steps: int = 30) -> list[tuple[float, float]]:
    """(predicted, measured) step seconds of each plan, each trained `steps` steps by the
    trainer in its own process (the last logged steps/s)."""
    out = []
    for c in plans:
        with tempfile.TemporaryDirectory() as logdir:
            cmd = [sys.executable, "-m", "lingpipe.trainer", f"--model={model}"]
            cmd += [f"--logdir={logdir}", f"--max_steps={steps}", "--log_interval_steps=10"]
            cmd += [f"--{k}={_FlagText(v)}" for k, v in PlanFlags(c).items()]
            done = subprocess.run(cmd, capture_output=True, text=True)
        rates = re.findall(r"([0-9.]+) steps/s", done.stderr + done.stdout)
        measured = 1.0 / float(rates[-1]) if rates else float("nan")
        out.append((c.step_seconds, measured))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m lingpipe.plan", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--model", required=True, help="a registered model (lm.TransformerLmTiny)")
    ap.add_argument("--devices", type=int, required=True, help="devices to use (N)")
    ap.add_argument("--memory_per_device", required=True, help="16GiB, 512MiB or bytes")
    ap.add_argument("--global_batch", type=int, default=None, help="default: the model's")
    ap.add_argument("--json", default=None, help="write the plan and candidates here")
    ap.add_argument("--verify", type=int, default=0, help="train the top N plans and compare")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    try:
        if args.devices < 1:
            raise PlanError(f"--devices={args.devices}: expected a number of devices >= 1")
        if args.global_batch is not None and args.global_batch < 1:
            raise PlanError(f"--global_batch={args.global_batch}: expected a batch size >= 1")
        cap = ParseSize(args.memory_per_device)
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        from lingpipe import cluster

        if args.devices > 1:
            cluster.SetLogicalCpuDevices(args.devices)  # without accelerators: CPU devices
        from lingpipe.pipeline import planner

        model = RegisteredModel(args.model, args.global_batch)
        result = Plan(model, args.devices, cap, planner.MeasureRates())
    except PlanError as e:
        print(f"lingpipe.plan: {e}", file=sys.stderr)
        return 2
    print(Screen(model, result, cap))
    written = Json(result, model, args.devices, cap)
    if args.verify:
        plans = [result.chosen, *result.runners_up][: args.verify]
        print("verify: predicted / measured step time")
        written["verify"] = []
        for c, (pred, meas) in zip(plans, Verify(args.model, plans)):
            error = (pred - meas) / meas * 100 if meas == meas else float("nan")
            print(f"  {pred * 1e3:8.1f} ms / {meas * 1e3:8.1f} ms ({error:+.0f}%)  {c.Describe()}")
            written["verify"].append(
                dict(flags=PlanFlags(c), predicted_seconds=pred, measured_seconds=meas)
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(written, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
