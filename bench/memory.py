"""Peak memory of one training step: plain stack vs PipeliningLayer over K, M and remat.

    python bench/memory.py                  # all configurations, table + bench/results/memory.json
    python bench/memory.py --models=mlp --stages=1,2 --micro_batches=1,8

Each configuration runs in its own process. On CPU, TensorFlow counts the whole
process in one allocator (all logical devices together), so the peak is the
step's total, not one device's; on a GPU machine read per-device numbers instead.

Beside each pipelined row: the estimate of lingpipe.pipeline.observe.memory (the sum over
stages of PartitionReport's totals, no optimizer slots: the step only computes
gradients), its ratio to the measured peak, and the simulated peak of alive
micro-batches per stage.

    python bench/memory.py --rows=schedules   # each training schedule x remat, K=4, M=16,
                                              # and K=2, M=8 for GPipe and 1F1B,
                                              # through ForwardBackward: memory_schedules.json
    python bench/memory.py --rows=precision   # float32 vs bfloat16 activations:
                                              # memory_precision.json
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import common  # noqa: E402

MIB = 1024 * 1024
# Every training schedule with its stages per device (v; zbv and dualpipev always run 2).
SCHEDULES = [
    ("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("zero_bubble", 1), ("zbv", 1),
    ("looped_bfs", 2), ("interleaved_zero_bubble", 2), ("dualpipev", 1),
]  # fmt: skip


def Child(
    model: str,
    stages: int,
    micro: int,
    remat: str,
    schedule: str = "",
    virtual: int = 1,
    dtype: str = "float32",
) -> dict:
    """One configuration, measured in this process. schedule='' differentiates FProp
    under a tape (fill-drain); a schedule's name runs ForwardBackward. `dtype` is
    the activations' (the weights stay float32)."""
    common.Setup(max(stages, 1))
    import tensorflow as tf

    layer = common.Build(model, stages, micro, remat, schedule or "gpipe", virtual, dtype)
    inputs = common.Inputs(model, dtype)
    step = common.TrainStep(layer, executor=bool(schedule))
    step(*inputs)  # trace, allocate
    tf.config.experimental.reset_memory_stats("CPU:0")
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    step(*inputs)[0].numpy()
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    row = {
        "model": model,
        "schedule": (schedule or "gpipe (tape)") + (f" v={virtual}" if virtual > 1 else ""),
        "stages": stages or "plain",
        "micro_batches": micro,
        "remat": remat if stages else "-",
        "dtype": dtype,
        "peak_mib": peak / MIB,
        "step_mib": (peak - before) / MIB,
    }
    if stages:
        row.update(Estimate(layer, inputs, peak))
    return row


def Estimate(layer, inputs, peak: float) -> dict:
    """The estimate's columns of a row: one allocator's peak over every stage
    (memory.HostMemory: on CPU one allocator serves all the logical devices, so this is
    what `peak` measures), its ratio to `peak`, the largest device's estimate (what one
    accelerator would hold) and the simulated peak of alive micro-batches per stage."""
    from lingpipe.pipeline.observe import memory as memory_lib

    report = layer.PartitionReport(input_shapes=[x.shape for x in inputs])
    devices = dict.fromkeys(s.device for s in report.stages)
    host = memory_lib.HostMemory(
        [[s.memory for s in report.stages if s.device == d] for d in devices]
    )
    return {
        "estimate_mib": host / MIB,
        "est/peak": host / peak,
        "est_device_mib": max(m.total for m in report.DeviceMemory().values()) / MIB,
        "sim_alive": "/".join(str(s.memory.peak_alive) for s in report.stages),
    }


def Rescore(path: str) -> None:
    """Writes the estimate's columns of the rows of `path` (a memory*.json) again from
    the code as it is, measuring nothing: each configuration built in this process
    (the estimate traces its cells and runs no step)."""
    import json

    common.Setup(4)
    with open(path) as f:
        payload = json.load(f)
    for row in payload["rows"]:
        if row.get("stages") in (None, "plain") or "peak_mib" not in row:
            continue
        name, _, virtual = row["schedule"].partition(" v=")
        schedule = "" if name == "gpipe (tape)" else name
        layer = common.Build(
            row["model"], int(row["stages"]), int(row["micro_batches"]), row["remat"],
            schedule or "gpipe", int(virtual or 1), row.get("dtype", "float32"),
        )  # fmt: skip
        inputs = common.Inputs(row["model"], row.get("dtype", "float32"))
        row.update(Estimate(layer, inputs, row["peak_mib"] * MIB))
    if "checks" in payload:
        payload["checks"] = Checks(payload["rows"])
    payload["rescored"] = "estimate columns written again by python bench/memory.py --rescore"
    common.WriteJson(path, payload)
    print(f"wrote {path}")


def Schedules(models: list[str]) -> list[dict]:
    """Each training schedule x remat at K=4, M=16, and GPipe and 1F1B at K=2, M=8 (each
    in its own process), through ForwardBackward."""
    configs = [
        (4, 16, remat, sched, v)
        for sched, v in SCHEDULES
        for remat in ("always", "except_last", "never")
    ]
    configs += [(2, 8, r, s, 1) for s in ("gpipe", "1f1b") for r in ("always", "never")]
    rows = []
    for model in models:
        for k, m, r, sched, v in configs:
            flags = [f"--models={model}", f"--stages={k}", f"--micro_batches={m}"]
            flags += [f"--remat={r}", f"--schedule={sched}", f"--virtual={v}"]
            row = common.RunChild(__file__, flags)
            row.setdefault("model", model)
            rows.append(row)
            print(common.Table([row], list(row)), flush=True)
    return rows


def Precision(models: list[str]) -> list[dict]:
    """float32 against bfloat16 activations (float32 weights): the plain stack, and
    1F1B at K=2 and K=4, M=8, remat always and never, through ForwardBackward."""
    configs = [(0, 1, "never", "")] + [
        (k, 8, r, "1f1b") for k in (2, 4) for r in ("always", "never")
    ]
    rows = []
    for model in models:
        for k, m, r, sched in configs:
            for dtype in ("float32", "bfloat16"):
                flags = [f"--models={model}", f"--stages={k}", f"--micro_batches={m}"]
                flags += [f"--remat={r}", f"--schedule={sched}", f"--dtype={dtype}"]
                row = common.RunChild(__file__, flags)
                row.setdefault("model", model)
                if dtype == "bfloat16" and rows and "step_mib" in rows[-1] and "step_mib" in row:
                    row["vs_float32"] = row["step_mib"] / rows[-1]["step_mib"]
                rows.append(row)
                print(common.Table([row], list(row)), flush=True)
    return rows


def Checks(rows: list[dict]) -> list[str]:
    """The issue's claims, read off the rows: 1F1B's peak against GPipe's (never, K=4,
    M=16), except_last against always at the same M, the estimate's worst ratio."""

    def Peak(model, sched, remat, k=4, key="peak_mib"):
        for r in rows:
            if (r.get("model"), r.get("schedule"), r.get("remat"), r.get("stages")) == (
                model,
                sched,
                remat,
                k,
            ) and key in r:
                return r[key]
        return None

    out = []
    for model in dict.fromkeys(r.get("model") for r in rows):
        g, f = Peak(model, "gpipe", "never"), Peak(model, "1f1b", "never")
        if g and f:
            out.append(f"{model}: remat=never K=4 M=16: 1F1B peak / GPipe peak = {f / g:.2f}")
        for sched in [n + (f" v={v}" if v > 1 else "") for n, v in SCHEDULES]:
            a, e = Peak(model, sched, "always"), Peak(model, sched, "except_last")
            if a and e:
                line = f"{model} {sched}: except_last / always (K=4, M=16) = {e / a:.2f}"
                a, e = (
                    Peak(model, sched, r, key="est_device_mib") for r in ("always", "except_last")
                )
                if a and e:
                    line += f" (all stages, measured); {e / a:.2f} (largest device, estimated)"
                out.append(line)
    ratios = [r["est/peak"] for r in rows if "est/peak" in r]
    if ratios:
        out.append(f"estimate / measured peak: {min(ratios):.2f} .. {max(ratios):.2f}")
    return out


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
        "--rows", default="grid", choices=["grid", "schedules", "precision"],
        help="grid (K x M x remat), schedules, or precision (float32 vs bfloat16)",
    )  # fmt: skip
    ap.add_argument("--schedule", default="", help=argparse.SUPPRESS)
    ap.add_argument("--virtual", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help="JSON path (default bench/results/memory*.json)")
    ap.add_argument(
        "--rescore",
        default="",
        help="a memory*.json: its estimate columns again, measuring nothing",
    )
    args = ap.parse_args()
    if args.rescore:
        Rescore(args.rescore)
        return
    results = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    if args.child:
        import json

        row = Child(
            args.models,
            int(args.stages),
            int(args.micro_batches),
            args.remat,
            args.schedule,
            args.virtual,
            args.dtype,
        )
        print(json.dumps(row))
        return
    if args.rows == "precision":
        rows = Precision(args.models.split(","))
        columns = ["model", "schedule", "stages", "micro_batches", "remat", "dtype", "step_mib"]
        print(common.Table(rows, columns + ["vs_float32", "estimate_mib", "est/peak"]))
        out = args.out or os.path.join(results, "memory_precision.json")
        common.WriteJson(out, {"machine": common.Machine(), "rows": rows})
        print(f"wrote {out}")
        return
    if args.rows == "schedules":
        rows = Schedules(args.models.split(","))
        columns = ["model", "schedule", "stages", "micro_batches", "remat", "peak_mib"]
        columns += ["estimate_mib", "est/peak", "est_device_mib", "sim_alive"]
        print(common.Table(rows, columns))
        checks = Checks(rows)
        print("\n".join(checks))
        out = args.out or os.path.join(results, "memory_schedules.json")
        common.WriteJson(out, {"machine": common.Machine(), "rows": rows, "checks": checks})
        print(f"wrote {out}")
        return
    args.out = args.out or os.path.join(results, "memory.json")
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
    print(common.Table(rows, columns + ["estimate_mib", "est/peak", "sim_alive"]))
    print("\n".join(Checks(rows)))
    print("\nstep MiB (peak minus what was allocated before the step), plain stack = 100%:")
    print(Pivot(rows))
    common.WriteJson(args.out, {"machine": common.Machine(), "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
