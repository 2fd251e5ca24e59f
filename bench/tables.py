"""bench/README.md's tables, written from bench/results/*.json (never typed by hand).

    python bench/tables.py           # rewrites the tables between bench/README.md's markers
    python bench/tables.py --check   # exit 1 if bench/README.md differs from what it would write

Every JSON file of the benchmarks' common shape gets a section: a title (from TITLES, or
the file's name), the machine and date it was measured on, its "source" when it was
not written by a benchmark run, the command that makes it, and a table of its "rows"
(every other list of flat rows, such as bench/gpu.py's sections, gets a table too).
A new benchmark's JSON (bench/plan.py's plan.json, say) is picked up as it lands; a
line in TITLES gives it a better title.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from bench import gpu_report  # noqa: E402

RESULTS = os.path.join(HERE, "results")
README = os.path.join(HERE, "README.md")
BEGIN = "<!-- tables:begin (written by python bench/tables.py; do not edit) -->"
END = "<!-- tables:end -->"

# file stem -> (title, what the rows are, the command that writes the file)
TITLES: dict[str, tuple[str, str, str]] = {
    "memory": (
        "Peak memory of a training step",
        "`peak_mib` the CPU allocator's peak in the step, `step_mib` that peak above what "
        "was allocated before the step, `vs_plain` step_mib against the plain stack's; K "
        "stages (`stages`), M micro-batches; `gpipe (tape)`: the layer's FProp "
        "differentiated under a tape. `estimate_mib`: lingpipe's estimate of one "
        "allocator's peak over all stages (memory.HostMemory), no optimizer slots (the "
        "step computes gradients only); `est_device_mib` the largest device's. "
        "`mlp`: 16 layers of 256 units, batch 8192; "
        "`transformer`: 8 pre-norm layers, d=256, 4 heads, batch 32 x 128 tokens; "
        "`mlp_wide`: 16 x 1024 at batch 1024. On CPU one allocator serves every logical "
        "device, so memory is the step's total over all stages.",
        "python bench/memory.py",
    ),
    "memory_schedules": (
        "Memory by schedule",
        "`peak_mib` the CPU allocator's peak (all stages together); `estimate_mib` "
        "lingpipe's estimate of the same; `est_device_mib` the largest device's estimate, "
        "what one accelerator would hold; `sim_alive` the simulated peak of alive "
        "micro-batches per stage.",
        "python bench/memory.py --rows=schedules --models=mlp",
    ),
    "memory_precision": (
        "bfloat16 memory",
        "Activations in bfloat16, weights float32; `step_mib` above what was allocated "
        "before the step, `vs_float32` against the float32 row above it.",
        "python bench/memory.py --rows=precision",
    ),
    "speed": (
        "Step time",
        "Median of 5 steps, ms. MLP 8 x 512 at batch 512, transformer 4 layers, d=128, "
        "batch 16 x 64; `intra1_interK`: intra_op=1, inter_op=K, so stages run side by side.",
        "python bench/speed.py",
    ),
    "speed_precision": (
        "bfloat16 and XLA per stage",
        "A 1F1B training step, and the plain stack with `jit_compile` over its step; "
        "median of 5 steps, ms.",
        "python bench/speed.py --rows=precision",
    ),
    "schedules": (
        "Step time by schedule",
        "A training step through `ForwardBackward`, remat 'always', intra_op=1 and "
        "inter_op=K; `bubble` is the simulation's idle share with F=1, B=2.",
        "python bench/schedules.py --models=mlp",
    ),
    "schedules_transformer": (
        "Step time by schedule (transformer)",
        "As the table above, for the transformer.",
        "python bench/speed.py --rows=schedules",
    ),
    "schedules_simulated": (
        "Schedules simulated",
        "Each schedule simulated under unit costs (F = I = W = 1, B = 2): the same on any machine.",
        "python bench/schedules.py --simulated",
    ),
    "timeline": (
        "Measured idle against the plan",
        "The speed MLP, remat 'never', intra_op=1, inter_op=2; idle share per device from "
        "the profiler's op times, beside the simulation's.",
        "python bench/timeline.py",
    ),
    "capacity": (
        "The GPipe capacity table",
        "The largest Transformer stack (d=256, 4 heads, hidden 1024, batch 32 x 128 "
        "tokens, Adam) within 256 MiB per device, searched with the memory estimate and "
        "checked against the CPU allocator where one process can measure it.",
        "python bench/capacity.py",
    ),
    "keras_models": (
        "Keras models",
        "One `train_on_batch` step, SGD with momentum, batch 64 of 32x32x3, K=2, M=4, "
        "remat 'always'; `peak_mib` is both stages together on CPU.",
        "python bench/keras_models.py; python bench/keras_models.py --model=resnet50",
    ),
    "keras_applications": (
        "keras.applications models",
        "Each model cut over 2 stages, predicted against the plain model and trained.",
        "python bench/keras_applications.py",
    ),
    "signal_sweep": (
        "Signals at points of a short run",
        "SIGTERM and SIGINT sent at each delay; every answer against the trainer's "
        "exit-status table.",
        "python bench/signal_sweep.py",
    ),
    "plan": ("The planner, predicted against measured", "", "python bench/plan.py"),
    "plan_replay": (
        "The planner's grid in part, after the replay fix",
        "M in {1, 2}; gpipe, 1f1b and zero_bubble; remat never and always; the Keras "
        "classifier and the 32k LM. Measured after a replayed forward was made to wait for "
        "the gradient it serves (recomputation had saved no memory where the replay could "
        "run early); `repeat` compares each configuration with the full grid above, "
        "measured before.",
        "python bench/plan.py --models=keras,lm32k --micro_batches=1,2 "
        "--schedules=gpipe,1f1b,zero_bubble --remats=never,always --no_plan100 "
        "--out=bench/results/plan_replay.json --against=bench/results/plan.json",
    ),
    "plan_lm32k_w": (
        "The 32k LM's grid in part, W profiled after I",
        "M in {1, 8}, remat never, every schedule; measured after a split backward's W "
        "was profiled as the weights' own ops after I (the full grid's 32k LM rows above "
        "predate it). `repeat` compares each configuration's measured step with the full "
        "grid's.",
        "python bench/plan.py --models=lm32k --micro_batches=1,8 --remats=never "
        "--builds=1 --no_plan100 --out=bench/results/plan_lm32k_w.json "
        "--against=bench/results/plan.json",
    ),
    "plan_default_threads": (
        "The planner's grid under TensorFlow's default threads (MLP)",
        "The grid above runs one thread per device (intra-op 1, inter-op 2). The trainer "
        "and `python -m lingpipe.plan` run with TensorFlow's default threads unless told "
        "otherwise (--intra_op_threads, --inter_op_threads): there the two CPU devices share "
        "the intra-op threads, and a large op alone runs on both cores. The same MLP grid, "
        "measured so. `repeat` compares each configuration's measured step with the run "
        "before it (its `against` says which). Two earlier runs of this grid, with the "
        "same code for the K=2 rows, predicted the same configurations up to 26% apart: "
        "the profile's spread from run to run under shared threads, which the readings "
        "in pairs narrow.",
        "python bench/plan.py --models=mlp --threads=default --no_plan100 "
        "--out=bench/results/plan_default_threads.json --against=FILE",
    ),
    "plan_hosts": (
        "The memory estimate per device, each device with an allocator of its own",
        "The grid's configurations (bench/results/plan.json) at M 1 and 8, remat never "
        "and always, each stage in a process of its own: two `lingpipe.worker` processes "
        "over loopback (one CPU device each) and a chief, `--strategy=hosts`'s way. Per "
        "device (lists in device order), `estimate_mib` the memory estimate "
        "(memory.DeviceMemory, what the planner's cap bounds), `measured_mib` the most its "
        "worker's allocator held (the worker's stop line), `memory_err` estimate / "
        "measured - 1; `one_process_err` the grid's row, both devices in one allocator; "
        "`requested_mib` the most the device's tensors asked for at once (a trace of the "
        "worker from before the build), `slack_mib` what the allocator's chunks held "
        "beyond that at the trace's peak, `tensors_err` estimate / requested - 1. "
        "`--reestimate` writes the estimates of the day's code over the same measurements.",
        "python bench/plan_hosts.py --allocations, then --reestimate",
    ),
    "plan_hosts_worker_threads": (
        "The memory estimate per device, workers with the grid's threads (MLP)",
        "The MLP rows of the section above again, each worker with one intra-op and two "
        "inter-op threads (the grid's one process has these for both devices) instead of "
        "TensorFlow's default.",
        "python bench/plan_hosts.py --models=mlp --worker_threads=1,2 "
        "--out=bench/results/plan_hosts_worker_threads.json, then --reestimate",
    ),
    "pairs": (
        "Pairs timed in turn",
        "Two configurations built side by side and timed in turn (bench/pairs.py): "
        "`ratio` is second / first, the median over the rounds, `ratio_min` and "
        "`ratio_max` its spread; `predicted_ratio` the planner's. `pick` rows: the "
        "planner's pick (first) against the best configuration that the grid measured "
        "under the same cap (second), `pick_vs_best` how much slower the pick ran. "
        "`partition` rows: the cost-based cut (first) against the uniform one (second), "
        "1F1B, remat never.",
        "python bench/pairs.py",
    ),
    "gpu": ("GPU evidence", "See the GPU evidence section above.", "python bench/gpu.py"),
    "gpu_speed": ("GPU evidence", "", "python bench/gpu.py --sections=speed,precision"),
}
# The columns of a file's "rows" table where it has more than a page can show (the JSON
# keeps every field).
COLUMNS: dict[str, tuple[str, ...]] = {
    "plan": (
        "model", "R", "K", "M", "schedule", "v", "remat", "partition", "cells",
        "predicted_s", "calibrated_s", "measured_s", "measured_best_s", "predicted_err",
        "calibrated_err", "flops_err", "peak_device_mib", "predicted_mib", "measured_mib",
        "memory_err", "load", "error",
    ),
}  # fmt: skip
COLUMNS["plan_replay"] = COLUMNS["plan_default_threads"] = COLUMNS["plan_lm32k_w"] = COLUMNS["plan"]
COLUMNS["pairs"] = (
    "pair", "model", "M", "cap_mib", "first", "second", "predicted_ratio", "ratio",
    "ratio_min", "ratio_max", "pick_vs_best", "first_s", "second_s", "error",
)  # fmt: skip
# Files with a page of their own, written by their script from the same JSON.
ELSEWHERE = {
    "keras_conformance": "docs/keras_conformance.md (python bench/keras_conformance.py)",
    "gpu_smoke": "bench/results/gpu_smoke.md (python bench/gpu.py --smoke)",
}
# Runs of bench/gpu.py (gpu.json, and gpu_*.json for a run of some --sections) are
# shown as that script's own report, written from the same JSON.
GPU_RUN = re.compile(r"gpu(_\w+)?$")
_META = ("machine", "date", "date_source", "source", "command", "notes", "checks")


def Section(stem: str, payload: dict[str, Any]) -> str:
    title, what, command = TITLES.get(stem, (stem.replace("_", " ").capitalize(), "", ""))
    lines = [f"### {title}", ""]
    if what:
        lines += [what, ""]
    lines.append(f"- Machine: {_Machine(payload.get('machine'))}.")
    date = payload.get("date") or "not recorded"
    if payload.get("date_source"):
        date += f" ({payload['date_source']})"
    lines.append(f"- Date: {date}.")
    if payload.get("source"):
        lines.append(f"- Source: {payload['source']}.")
    lines.append(
        f"- Written by: `{payload.get('command') or command or '?'}`, to "
        f"`bench/results/{stem}.json`."
    )
    settings = {k: v for k, v in payload.items() if k not in _META and _Scalar(v)}
    if settings:
        lines.append("- Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()) + ".")
    for key, rows in _Tables(payload):
        columns = COLUMNS.get(stem) if key == "rows" else None
        lines += ["", f"`{key}`:" if key != "rows" else "", _Markdown(rows, columns)]
    for key in ("checks", "notes"):
        if payload.get(key):
            lines += ["", *[f"- {line}" for line in payload[key]]]
    return "\n".join(line for i, line in enumerate(lines) if line or lines[i - 1]) + "\n"


def GpuSection(stem: str, payload: dict[str, Any]) -> str:
    """bench/gpu.py's report of a run, its headings under this page's, and its notes."""
    text = gpu_report.Markdown(payload)
    text = re.sub(r"^(#+) ", lambda m: "#" * (len(m.group(1)) + 2) + " ", text, flags=re.M)
    title, rest = text.split("\n", 1)
    lines = [title, "", f"- Written to `bench/results/{stem}.json`."]
    lines += [f"- {line}" for line in payload.get("notes", [])]
    return "\n".join(lines) + "\n" + rest


def _Machine(machine: Any) -> str:
    if not isinstance(machine, dict):
        return "not recorded"
    parts = [f"{machine.get('cpu_count', '?')} CPU cores ({machine.get('machine', '?')})"]
    gpus = machine.get("gpus") or []
    parts.append(f"GPUs: {', '.join(map(str, gpus))}" if gpus else "no GPU")
    if machine.get("tf"):
        parts.append(f"TensorFlow {machine['tf']}")
    if machine.get("python"):
        parts.append(f"Python {machine['python']}")
    return ", ".join(parts)


def _Scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) and not isinstance(value, dict)


def _Flat(rows: Any) -> bool:
    return (
        isinstance(rows, list)
        and bool(rows)
        and all(
            isinstance(r, dict) and all(not isinstance(v, dict) for v in r.values()) for r in rows
        )
    )


def _Tables(payload: dict[str, Any], prefix: str = "") -> list[tuple[str, list[dict]]]:
    """Every list of flat rows in `payload`, "rows" first, nested dicts walked."""
    found = []
    for key in sorted(payload, key=lambda k: k != "rows"):
        value = payload[key]
        if key in _META:
            continue
        if _Flat(value):
            found.append((prefix + key, value))
        elif isinstance(value, dict):
            found += _Tables(value, f"{prefix}{key}.")
    return found


def _Markdown(rows: list[dict[str, Any]], only: tuple[str, ...] | None = None) -> str:
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns and (only is None or c in only)]
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        out.append("| " + " | ".join(_Cell(row.get(c)) for c in columns) + " |")
    return "\n".join(out)


def _Cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        text = f"{value:.3f}" if value == 0 or abs(value) >= 1e-3 else f"{value:.1e}"
    elif isinstance(value, list):
        text = ", ".join(map(str, value))
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def Tables(results: str = RESULTS) -> str:
    """The markdown between the markers, from every JSON file in `results`."""
    sections, elsewhere = [], []
    order = list(TITLES)
    paths = sorted(
        glob.glob(os.path.join(results, "*.json")),
        key=lambda p: (order.index(_Stem(p)) if _Stem(p) in order else len(order), _Stem(p)),
    )
    for path in paths:
        stem = _Stem(path)
        if stem in ELSEWHERE:
            elsewhere.append(f"- `{stem}.json`: the table is {ELSEWHERE[stem]}.")
            continue
        with open(path, encoding="utf-8") as f:
            payload = json.load(f)
        if not isinstance(payload, dict):
            raise SystemExit(
                f"{path}: expected a JSON object with 'rows'; received a {type(payload).__name__}"
            )
        writer = GpuSection if GPU_RUN.match(stem) and "sections" in payload else Section
        sections.append(writer(stem, payload))
    text = "\n".join(sections)
    if elsewhere:
        text += "\n### Elsewhere\n\n" + "\n".join(elsewhere) + "\n"
    return text


def _Stem(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


def Rewrite(readme: str, tables: str) -> str:
    """`readme` with the text between the markers replaced by `tables`."""
    if BEGIN not in readme or END not in readme:
        raise SystemExit(f"bench/README.md: expected the markers {BEGIN!r} and {END!r}")
    head, rest = readme.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    return f"{head}{BEGIN}\n\n{tables}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if bench/README.md is stale")
    args = ap.parse_args(argv)
    with open(README, encoding="utf-8") as f:
        current = f.read()
    wanted = Rewrite(current, Tables())
    if args.check:
        if wanted != current:
            print(
                "bench/README.md differs from bench/results/*.json: run python bench/tables.py",
                file=sys.stderr,
            )
            return 1
        return 0
    with open(README, "w", encoding="utf-8") as f:
        f.write(wanted)
    print(
        f"wrote {os.path.relpath(README)} from {len(glob.glob(os.path.join(RESULTS, '*.json')))} "
        "JSON files"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
