"""lingpipe's GPU evidence in one command, in under nine minutes on one GPU.

    python bench/gpu.py                  # bench/results/gpu.json and gpu.md beside it
    python bench/gpu.py --smoke          # the same code paths on logical CPU devices, tiny
                                         # sizes, under a minute on 2 cores: gpu_smoke.json
    python bench/gpu.py --sections=memory,speed     # some sections only

Sections (bench/README.md, "GPU evidence", says more):

  capacity   GPipe's capacity table: the deepest Transformer stack that trains on
             logical GPUs of 2 GiB each (a real out-of-memory, binary search on depth),
             with no pipeline and no recompute, with recompute on one device, and
             pipelined over K = 2, 4, 8 (bench/capacity.py's GPU mode); the ratio at
             K=8 against naive (GPipe reports 25x).
  memory     each logical GPU's peak in a pipelined training step against
             lingpipe.pipeline.observe.memory's estimate, for gpipe, 1f1b and zbv.
  speed      the plain stack against gpipe, 1f1b, zero_bubble and zbv over 4 logical
             GPUs, side by side in one process.
  precision  bfloat16 with XLA (per stage) against float32, side by side in one process.
  planner    lingpipe's plan on 2 logical GPUs with a memory cap each (bench/gpu_plan.py):
             its pick and runners-up trained in turn, each one's step time and each
             device's peak against the prediction.

Each part runs in a process of its own (an out-of-memory is a data point, not the end)
within a time budget (BUDGETS): a part still running at its budget is stopped and
keeps the rows it finished. The parts run in RUN_ORDER; capacity runs last and gets
what the others left of TOTAL_S, so the whole stays under nine minutes.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import budget, capacity, common, gpu_parts, gpu_plan, gpu_report  # noqa: E402

SECTIONS = ("capacity", "memory", "speed", "precision", "planner")
RUN_ORDER = ("memory", "planner", "precision", "speed", "capacity")
# Seconds, from the start of the run: the whole run, and each part's most (capacity: the
# rest). Set from the first run on an H100 (bench/README.md): a pipelined configuration's
# first two steps take 25-30 s there, building its graph, and 90 s ran two of five.
TOTAL_S = {"gpu": 540, "smoke": 300}
BUDGETS = {
    "gpu": dict(machine=30, memory=60, speed=170, precision=120, planner=150),
    # Caps for a loaded machine; the smoke run takes under a minute on 2 idle cores.
    "smoke": dict(machine=45, memory=75, speed=75, precision=75, planner=60),
}
# GPU memory (MiB) a process needs beside its logical GPUs' limits (CUDA context, cuBLAS).
CONTEXT_MIB = 1024
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="logical CPU devices, tiny sizes")
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated, in any order")
    ap.add_argument("--out", default="", help="the JSON path, the markdown table beside it (.md); "
                    "default bench/results/gpu.json (--smoke: gpu_smoke.json)")  # fmt: skip
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--part", default="", help=argparse.SUPPRESS)
    ap.add_argument("--schedule", default="", help=argparse.SUPPRESS)
    ap.add_argument("--parallel", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--budget_s", type=float, default=600.0, help=argparse.SUPPRESS)
    ap.add_argument("--total_s", type=float, default=0,
                    help="the whole run's seconds (0: 540 on a GPU, 300 with --smoke)")  # fmt: skip
    args = ap.parse_args(argv)
    if args.child:
        return Child(args)
    sections = [s for s in args.sections.split(",") if s]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown or not sections:
        ap.error(
            f"expected --sections from {', '.join(SECTIONS)}; received --sections={args.sections}"
        )
    args.out = args.out or os.path.join(
        HERE, "results", "gpu_smoke.json" if args.smoke else "gpu.json"
    )
    if not args.out.endswith(".json"):
        ap.error(f"expected --out to be a path ending in .json; received --out={args.out}")
    if args.total_s < 0:
        ap.error(f"expected --total_s to be seconds >= 0; received --total_s={args.total_s:g}")
    return Run(args, sections)


def Child(args: argparse.Namespace) -> int:
    parts = {
        "machine": lambda: gpu_parts.Machine(args.smoke),
        "capacity": lambda: gpu_parts.Capacity(args.smoke, args.parallel),
        "memory": lambda: gpu_parts.Memory(args.smoke, args.schedule),
        "speed": lambda: gpu_parts.Speed(args.smoke, args.budget_s),
        "precision": lambda: gpu_parts.Precision(args.smoke, args.budget_s),
        "planner": lambda: gpu_plan.Planner(args.smoke, args.budget_s, gpu_parts.Setup),
    }
    parts[args.part]()
    return 0


class Runner:
    """Starts the parts as children (gpu.py --child --part=...) within the run's clock."""

    def __init__(self, smoke: bool, total_s: float = 0) -> None:
        self.smoke = smoke
        self.mode = gpu_parts.Mode(smoke)
        self.start = time.monotonic()
        self.seconds: dict[str, float] = {}  # each part's wall time
        self.budgets: dict[str, float] = {}  # and the time it was given
        self.total_s = total_s or TOTAL_S[self.mode]
        self.end = self.start + self.total_s
        # Kernels that CUDA compiles from PTX (TensorFlow's wheel has no sm_90 code) stay in
        # its cache for the next child; its default size is too small to keep them all.
        self.env = dict(os.environ)
        self.env.setdefault("CUDA_CACHE_MAXSIZE", str(4 << 30))  # its largest: 4 GiB
        # `python -m lingpipe.plan` imports this checkout's lingpipe, as the scripts do.
        path = [ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        self.env["PYTHONPATH"] = os.pathsep.join(path)
        if smoke:  # Its XLA clusters only need to run: compile them without LLVM's passes.
            flags = [os.environ.get("XLA_FLAGS", ""), "--xla_backend_optimization_level=0"]
            self.env["XLA_FLAGS"] = " ".join(filter(None, flags))

    def Deadline(self, part: str) -> float:
        limit = BUDGETS[self.mode].get(part)
        return self.end if limit is None else min(self.end, time.monotonic() + limit)

    def Argv(self, part: str, *extra: str) -> list[str]:
        """The command of a part's child; --budget_s: the seconds it has from now."""
        flags = [f"--part={part}", f"--budget_s={self.Deadline(part) - time.monotonic():.0f}"]
        return budget.Script(__file__, flags + (["--smoke"] if self.smoke else []) + list(extra))

    def Part(self, part: str, argvs: list[list[str]], parallel: int = 1) -> list[budget.Outcome]:
        """Runs the part's children; `self.seconds[part]` gets its wall time."""
        start, deadline = time.monotonic(), self.Deadline(part)
        self.budgets[part] = deadline - start
        print(f"{part}: {len(argvs)} process(es), up to {deadline - start:.0f} s", flush=True)
        outcomes = budget.RunAll(argvs, deadline, parallel, self.env)
        self.seconds[part] = time.monotonic() - start
        for o in outcomes:
            error = f", {o.error}" if o.error else ""
            print(f"  {o.seconds:.0f} s, {len(o.lines)} line(s){error}", flush=True)
        return outcomes


def Run(args: argparse.Namespace, sections: list[str]) -> int:
    runner = Runner(args.smoke, args.total_s)
    (machine_run,) = runner.Part("machine", [runner.Argv("machine")])
    machine = (machine_run.Of("machine") or [{}])[0]
    if not machine:
        print(f"bench/gpu.py: the machine part failed: {machine_run.error}", file=sys.stderr)
        return 1
    for first in machine_run.Of("first_step"):
        machine["first_step_s"] = first["seconds"]
    if machine_run.error:  # its first step, stopped at the budget
        machine["error"] = machine_run.error
    if not args.smoke and not machine.get("gpus"):
        print(
            "bench/gpu.py: no GPU visible to TensorFlow (tf.config.list_physical_devices('GPU') "
            "is empty); it measures on a GPU, and --smoke runs its code paths on CPU",
            file=sys.stderr,
        )
        return 1
    command = ["python bench/gpu.py"] + ["--smoke"] * args.smoke
    if sections != list(SECTIONS):
        command.append(f"--sections={args.sections}")
    result = {
        "command": " ".join(command),
        "smoke": args.smoke,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "total_budget_s": runner.total_s,
        "machine": dict(machine, seconds=machine_run.seconds),
        "sections": {},
    }
    builders = {
        "capacity": lambda: Capacity(runner, machine),
        "memory": lambda: Memory(runner, machine),
        "speed": lambda: Timed(runner, "speed"),
        "precision": lambda: Timed(runner, "precision"),
        "planner": lambda: Planner(runner),
    }
    done = {}
    for name in RUN_ORDER:
        if name in sections:
            done[name] = builders[name]()
    result["sections"] = {name: done[name] for name in SECTIONS if name in done}
    result["wall_s"] = time.monotonic() - runner.start
    common.WriteJson(args.out, result)
    md = args.out[: -len(".json")] + ".md"
    with open(md, "w") as f:
        f.write(gpu_report.Markdown(result))
    print(gpu_report.Markdown(result))
    print(f"wrote {args.out} and {md} in {result['wall_s']:.0f} s")
    return 0


def Fits(machine: dict, need_mib: int) -> bool:
    """Whether the GPU's memory (nvidia-smi's) holds `need_mib`; unknown is no."""
    return machine.get("memory_total_mib", 0) >= need_mib


def Section(
    runner: Runner, part: str, outcomes: list[budget.Outcome], rows: list[dict], **fields
) -> dict:
    """A section's JSON: its figures (rows) or, without any, a one-line reason (skipped);
    its wall time and budget, and each child's error (one line)."""
    out = dict(fields)
    out["seconds"] = runner.seconds.get(part, 0.0)
    out["budget_s"] = runner.budgets.get(part, 0.0)
    errors = [o.error for o in outcomes if o.error]
    if errors:
        out["errors"] = errors
    if rows:
        out["rows"] = rows
    else:
        out["skipped"] = "no figures: " + (errors[0] if errors else "its parts printed no rows")
    return out


def Memory(runner: Runner, machine: dict) -> dict:
    cfg = gpu_parts.SIZES[runner.mode]["memory"]
    n = len(gpu_parts.MEMORY_SCHEDULES)
    need = n * (cfg["stages"] * cfg.get("device_mib", 0) + CONTEXT_MIB)
    parallel = n if runner.smoke or Fits(machine, need) else 1
    argvs = [runner.Argv("memory", f"--schedule={s}") for s in gpu_parts.MEMORY_SCHEDULES]
    outcomes = runner.Part("memory", argvs, parallel)
    rows = [r for o in outcomes for r in o.Of("row")]
    fields = dict(config=dict(cfg, model=gpu_parts.Model(runner.mode, "memory")))
    if runner.smoke:
        fields["note"] = (
            "per-device peaks cannot be measured on CPU: one allocator serves every logical "
            "CPU device, so each row is the step's total (all devices) against the estimate's total"
        )
    else:
        fields["note"] = "each row one logical GPU (its own allocator): its peak in the step"
    return Section(runner, "memory", outcomes, rows, **fields)


def Timed(runner: Runner, part: str) -> dict:
    (outcome,) = runner.Part(part, [runner.Argv(part)])
    cfg = gpu_parts.SIZES[runner.mode][part]
    fields = dict(config=dict(cfg, model=gpu_parts.Model(runner.mode, part)))
    fields["first_steps_s"] = {x["config"]: x["first_two_steps_s"] for x in outcome.Of("setup")}
    fields["note"] = (
        "one process, each step timed in turns (median); the logical devices share one chip, "
        "so a pipeline's ratio to the plain stack is its overhead there, not a multi-GPU speed-up"
        if not runner.smoke
        else "smoke: logical CPU devices, tiny sizes; the times compare nothing"
    )
    # A config's figures come as they grow (TimeSideBySide): its last row is its figure.
    rows = list({r["config"]: r for r in outcome.Of("row")}.values())
    return Section(runner, part, [outcome], rows, **fields)


def Planner(runner: Runner) -> dict:
    """The planner's plan on logical devices with a cap each, and its picks measured
    there (bench/gpu_plan.py)."""
    (outcome,) = runner.Part("planner", [runner.Argv("planner")])
    cfg = gpu_plan.SIZES[runner.mode]
    fields = dict(config=cfg, plan=(outcome.Of("plan") or [None])[0])
    fields["note"] = (
        "each row one device of a plan trained with the trainer's step: its predicted "
        "and measured step (median) and peak"
        + (" (one allocator on CPU: the total)" if runner.smoke else " (its own allocator)")
    )
    return Section(runner, "planner", [outcome], outcome.Of("row"), **fields)


def Capacity(runner: Runner, machine: dict) -> dict:
    size = gpu_parts.SIZES[runner.mode]["capacity"]
    cfg = capacity.SIZES[size]
    ks = [k for _, k, _, _ in capacity.ROWS]
    parallel = len(ks) if Fits(machine, sum(ks) * cfg["cap_mib"] + len(ks) * CONTEXT_MIB) else 1
    (outcome,) = runner.Part("capacity", [runner.Argv("capacity", f"--parallel={parallel}")])
    rows = gpu_report.CapacityRows(outcome, capacity.ROWS, cfg)
    fields = dict(size=size, config=cfg, parallel_rows=parallel)
    k8 = next((r for r in rows if r.get("stages") == 8), {})
    fields["ratio_k8_vs_naive"] = k8.get("vs_naive") or k8.get("vs_naive_at_least")
    fields["gpipe_reports"] = "25x at K=8 against naive (GPipe, Table 1)"
    if runner.smoke or not machine.get("gpus"):
        fields["note"] = (
            "estimate only: no GPU, and logical CPU devices take no memory_limit, so no real "
            "out-of-memory; depths searched with lingpipe.pipeline.observe.memory's estimate "
            "(bench/capacity.py --mode=estimate)"
        )
    else:
        fields["note"] = (
            f"measured: each probe a process on K logical GPUs of {cfg['cap_mib']} MiB training "
            "two Adam steps, an out-of-memory is real; the search starts from the estimate's depth"
        )
    return Section(runner, "capacity", [outcome], rows, **fields)


if __name__ == "__main__":
    raise SystemExit(main())
