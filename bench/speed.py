"""Step time of PipeliningLayer against the plain stack, with two thread settings.

    python bench/speed.py            # table + bench/results/speed.json

Each row is one process. `threads=default` leaves TensorFlow's thread pools as
they are; `threads=intra1_interK` sets intra_op=1 and inter_op=K so that stages
run side by side, one core each (on a 2-core CPU the default pools
already use both cores inside every op, leaving a pipeline nothing to gain).
Rows with `mode=forward` time inference (eval mode, no gradients); the others a
training step (loss and all gradients). CPU timings are ratios only; absolute
times mean something on a GPU.

`--rows=precision` times the mixed-precision and XLA rows instead (PRECISION_CONFIGS):
the training step of the tasks (`ForwardBackward`, 1F1B) in float32 and bfloat16,
with and without `jit_compile_stages` (the plain stack: jit_compile over the step).

`--rows=schedules` runs bench/schedules.py: each schedule's training step at K=2
and K=4, M=8, with intra_op=1 and inter_op=K, beside its simulated bubble.
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


def PrecisionChild(model, stages, micro, remat, precision, xla, steps):
    """One row of PRECISION_CONFIGS: a 1F1B training step (the plain stack: a tape)."""
    common.UseSpeedSizes()
    common.Setup(max(stages, 1))
    import tensorflow as tf

    from lingpipe.layers import gpipe, sequential

    dtype = tf.as_dtype(precision)
    cells = [c.Set(fprop_dtype=dtype) for c in common.CellParams(model)]
    inputs = tuple(tf.cast(x, dtype) for x in common.Inputs(model))
    if stages == 0:
        layer = sequential.SequentialLayer.Params().Set(name="plain", sub=cells).Instantiate()

        def Step(*x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(tf.cast(layer(*x), tf.float32)))
            return loss, tape.gradient(loss, layer.trainable_variables)

        step = tf.function(Step, autograph=False, jit_compile=xla)
    else:
        layer = (
            gpipe.PipeliningLayer.Params()
            .Set(name="pipe", cell_tpl=cells, num_stages=stages, num_micro_batches=micro)
            .Set(remat=remat, schedule="1f1b", jit_compile_stages=xla)
            .Instantiate()
        )
        step = _ScheduledStep(layer)
    ms = _Median(lambda: tf.nest.map_structure(lambda t: t.numpy(), step(*inputs)), steps)
    return {"stages": stages or "plain", "micro_batches": micro, "remat": remat, "ms": ms}


def _ScheduledStep(layer):
    """tf.function: ForwardBackward's loss and gradients (the mean square of the outputs)."""
    import tensorflow as tf

    from lingpipe.nested_map import NestedMap

    def Loss(outputs, _):
        x = tf.cast(outputs, tf.float32)
        return NestedMap(loss=(tf.reduce_mean(tf.square(x)), tf.cast(tf.size(x), tf.float32)))

    def Step(*inputs):
        out = layer.ForwardBackward(layer.theta, inputs, Loss)
        return out.metrics.loss[0], tf.nest.flatten(out.theta_grads)

    return tf.function(Step, autograph=False)


def _Median(once, steps):
    for _ in range(2):
        once()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        once()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


# (stages, micro_batches, remat, precision, xla); stages 0 is the plain stack.
PRECISION_CONFIGS = [
    (s, m, r, prec, xla)
    for s, m, r in ((0, 1, "never"), (2, 8, "never"), (2, 8, "always"))
    for prec in ("float32", "bfloat16")
    for xla in (False, True)
]

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
    ap.add_argument("--rows", default="threads", choices=["threads", "precision", "schedules"])
    ap.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "speed.json")
    )
    args, rest = ap.parse_known_args()
    if args.rows == "schedules":
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schedules.py")
        flags = [f"--models={args.models}", f"--steps={args.steps}"]
        os.execv(sys.executable, [sys.executable, script] + flags + rest)
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.child and args.rows == "precision":
        k, m, remat, prec, xla = args.config.split(":")
        row = PrecisionChild(args.models, int(k), int(m), remat, prec, xla == "1", args.steps)
        print(json.dumps(row))
        return
    if args.rows == "precision":
        return PrecisionMain(args)
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


def PrecisionMain(args) -> None:
    """The PRECISION_CONFIGS rows; JSON in speed_precision.json beside --out."""
    rows = []
    for model in args.models.split(","):
        for k, m, remat, prec, xla in PRECISION_CONFIGS:
            flags = [f"--models={model}", f"--steps={args.steps}", "--rows=precision"]
            config = f"--config={k}:{m}:{remat}:{prec}:{int(xla)}"
            row = common.RunChild(__file__, flags + [config])
            row.update(model=model, precision=prec, xla=xla)
            rows.append(row)
            print(json.dumps(row), flush=True)
    for r in rows:
        base = [
            b
            for b in rows
            if (b["model"], b.get("stages"), b.get("remat"), b["precision"])
            == (r["model"], r.get("stages"), r.get("remat"), "float32")
            and not b["xla"]
        ]
        if base and "ms" in r and "ms" in base[0]:
            r["vs_float32"] = r["ms"] / base[0]["ms"]
    columns = ["model", "stages", "micro_batches", "remat", "precision", "xla", "ms", "vs_float32"]
    print(common.Table(rows, columns))
    out = os.path.join(os.path.dirname(args.out), "speed_precision.json")
    common.WriteJson(out, {"machine": common.Machine(), "rows": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
