"""Step time of PipeliningLayer against the plain stack, with two thread settings.

    python bench/speed.py            # table + bench/results/speed.json

Each row is one process. `threads=default` leaves TensorFlow's thread pools as
they are; `threads=intra1_interK` sets intra_op=1 and inter_op=K so that stages
run side by side, one core each (DESIGN.md: on a 2-core CPU the default pools
already use both cores inside every op, leaving a pipeline nothing to gain).
Rows with `mode=forward` time inference (eval mode, no gradients); the others a
training step (loss and all gradients). CPU timings are ratios only; absolute
times mean something on a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import common  # noqa: E402


def Child(model, stages, micro, remat, threads, mode, steps):
    common.UseSpeedSizes()
    k = max(stages, 1)
    if threads == "intra1_interK":
        common.Setup(k, intra_op=1, inter_op=max(k, 2))
    else:
        common.Setup(k)
    import tensorflow as tf

    from lingpipe import base_layer

    layer = common.Build(model, stages, micro, remat)
    inputs = common.Inputs(model)
    if mode == "forward":
        with base_layer.EvalMode():
            step = tf.function(lambda *x: layer(*x), autograph=False)
            step.get_concrete_function(*inputs)
    else:
        step = common.TrainStep(layer)

    def Once():
        tf.nest.map_structure(lambda t: t.numpy(), step(*inputs))

    for _ in range(2):
        Once()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        Once()
        times.append(time.perf_counter() - start)
    return {
        "model": model,
        "mode": mode,
        "threads": threads,
        "stages": stages or "plain",
        "micro_batches": micro,
        "remat": remat if stages else "-",
        "ms": 1000 * statistics.median(times),
    }


# (stages, micro_batches, remat, mode); stages 0 is the plain stack.
CONFIGS = [
    (0, 1, "never", "train"),
    (1, 1, "never", "train"),
    (1, 1, "always", "train"),
    (2, 1, "always", "train"),
    (2, 4, "always", "train"),
    (2, 8, "always", "train"),
    (2, 8, "never", "train"),
    (4, 8, "always", "train"),
    (0, 1, "never", "forward"),
    (2, 1, "never", "forward"),
    (2, 8, "never", "forward"),
    (4, 8, "never", "forward"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--models", default="mlp,transformer")
    ap.add_argument("--threads", default="default,intra1_interK")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--config", default="", help=argparse.SUPPRESS)
    ap.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "speed.json")
    )
    args = ap.parse_args()
    if args.child:
        k, m, remat, mode = args.config.split(":")
        row = Child(args.models, int(k), int(m), remat, args.threads, mode, args.steps)
        print(json.dumps(row))
        return
    rows = []
    for model in args.models.split(","):
        for threads in args.threads.split(","):
            for k, m, remat, mode in CONFIGS:
                row = common.RunChild(
                    __file__,
                    [
                        f"--models={model}",
                        f"--threads={threads}",
                        f"--steps={args.steps}",
                        f"--config={k}:{m}:{remat}:{mode}",
                    ],
                )
                row.update(model=model, threads=threads, mode=mode)
                rows.append(row)
                print(json.dumps(row), flush=True)
    for r in rows:
        base = next(
            (
                b
                for b in rows
                if b["model"] == r["model"]
                and b["threads"] == r["threads"]
                and b["mode"] == r["mode"]
                and b.get("stages") == "plain"
            ),
            None,
        )
        if base and "ms" in r and "ms" in base:
            r["vs_plain"] = r["ms"] / base["ms"]
    columns = ["model", "mode", "threads", "stages", "micro_batches", "remat", "ms", "vs_plain"]
    print(common.Table(rows, columns))
    common.WriteJson(args.out, {"machine": common.Machine(), "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
