"""Peak memory of one training step: plain stack vs PipeliningLayer over K, M and remat.

    python bench/memory.py                  # all configurations, table + bench/results/memory.json
    python bench/memory.py --models=mlp --stages=1,2 --micro_batches=1,8

Each configuration runs in its own process. On CPU, TensorFlow counts the whole
process in one allocator (all logical devices together), so the peak is the
step's total, not one device's; on a GPU machine read per-device numbers instead.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import common  # noqa: E402

MIB = 1024 * 1024


def Child(model: str, stages: int, micro: int, remat: str) -> dict:
    common.Setup(max(stages, 1))
    import tensorflow as tf

    layer = common.Build(model, stages, micro, remat)
    inputs = common.Inputs(model)
    step = common.TrainStep(layer)
    step(*inputs)  # trace, allocate
    tf.config.experimental.reset_memory_stats("CPU:0")
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    step(*inputs)[0].numpy()
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    return {
        "model": model,
        "stages": stages or "plain",
        "micro_batches": micro,
        "remat": remat if stages else "-",
        "peak_mib": peak / MIB,
        "step_mib": (peak - before) / MIB,
    }


def Pivot(rows: list[dict]) -> str:
    """One line per (model, stages, remat): step MiB and % of plain for each M."""
    micros = sorted({r["micro_batches"] for r in rows if r.get("stages") != "plain"})
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        plain = next((r for r in rows if r["model"] == model and r.get("stages") == "plain"), {})
        out.append(
            {"model": model, "stages": "plain", **{f"M={m}": _Cell(plain, plain) for m in [1]}}
        )
        keys = dict.fromkeys((r.get("stages"), r.get("remat")) for r in rows if r["model"] == model)
        for stages, remat in keys:
            if stages == "plain":
                continue
            line = {"model": model, "stages": stages, "remat": remat}
            for m in micros:
                r = next(
                    (
                        r
                        for r in rows
                        if (r["model"], r.get("stages"), r.get("remat"), r["micro_batches"])
                        == (model, stages, remat, m)
                    ),
                    {},
                )
                line[f"M={m}"] = _Cell(r, plain)
            out.append(line)
    return common.Table(out, ["model", "stages", "remat"] + [f"M={m}" for m in micros])


def _Cell(row: dict, plain: dict) -> str:
    if "step_mib" not in row:
        return "-"
    if not plain.get("step_mib"):
        return f"{row['step_mib']:.0f}"
    return f"{row['step_mib']:.0f} ({100 * row['step_mib'] / plain['step_mib']:.0f}%)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--models", default="mlp,transformer,mlp_wide")
    ap.add_argument("--stages", default="1,2,4")
    ap.add_argument("--micro_batches", default="1,2,4,8,16")
    ap.add_argument("--remat", default="always,except_last,never")
    ap.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "memory.json")
    )
    args = ap.parse_args()
    if args.child:
        import json

        print(json.dumps(Child(args.models, int(args.stages), int(args.micro_batches), args.remat)))
        return
    rows = []
    for model in args.models.split(","):
        configs = [(0, 1, "never")] + [
            (k, m, r)
            for k in map(int, args.stages.split(","))
            for m in map(int, args.micro_batches.split(","))
            for r in args.remat.split(",")
        ]
        for k, m, r in configs:
            row = common.RunChild(
                __file__,
                [f"--models={model}", f"--stages={k}", f"--micro_batches={m}", f"--remat={r}"],
            )
            row.setdefault("model", model)
            rows.append(row)
            print(common.Table([row], list(row)), flush=True)
    for model in args.models.split(","):
        plain = next((r for r in rows if r["model"] == model and r.get("stages") == "plain"), None)
        for r in rows:
            if r["model"] == model and plain and "step_mib" in r and plain.get("step_mib"):
                r["vs_plain"] = r["step_mib"] / plain["step_mib"]
    columns = ["model", "stages", "micro_batches", "remat", "peak_mib", "step_mib", "vs_plain"]
    print(common.Table(rows, columns))
    print("\nstep MiB (peak minus what was allocated before the step), plain stack = 100%:")
    print(Pivot(rows))
    common.WriteJson(args.out, {"machine": common.Machine(), "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
