"""GPipe in one command: a pipelined model trains exactly as the unpipelined one.

    python -m lingpipe.demo --num_stages=4 --num_micro_batches=8

Builds a stack of transformer layers twice from the same params (so with the
same initial weights): once as a PipeliningLayer over `num_stages` devices
(logical CPU devices when there are no accelerators) and once as a single stage
without micro-batches. Trains both with SGD on the same batches, prints the
partition report and both loss curves, and exits with status 1 if their weights
part by more than float32 rounding.
"""

from __future__ import annotations

import sys

from absl import app, flags

__all__ = [
    "FLAGS",
    "Run",
    "main",
]

FLAGS = flags.FLAGS
flags.DEFINE_integer("num_stages", 4, "Pipeline stages (devices).", lower_bound=1)
flags.DEFINE_integer("num_micro_batches", 8, "Micro-batches per batch.", lower_bound=1)
flags.DEFINE_enum("remat", "always", ["always", "except_last", "never"], "Recompute policy.")
flags.DEFINE_integer("num_layers", 8, "Transformer layers in the stack.", lower_bound=1)
flags.DEFINE_integer("steps", 10, "Training steps.", lower_bound=1)
flags.DEFINE_integer("batch", 32, "Examples per batch.", lower_bound=1)
flags.DEFINE_float("learning_rate", 0.05, "SGD learning rate.")


def _Build(num_stages: int, num_micro_batches: int, remat: str):
    from lingpipe.layers import gpipe, transformer

    layer = transformer.TransformerLayer.Params().Set(
        input_dims=32, num_heads=4, hidden_dims=64, causal=True
    )
    return (
        gpipe.PipeliningLayer.Params()
        .Set(
            name="stack",
            cell_tpl=[layer] * FLAGS.num_layers,
            num_stages=num_stages,
            num_micro_batches=num_micro_batches,
            remat=remat,
            partition="flops",
            input_shapes=[[FLAGS.batch, 16, 32]],
        )
        .Instantiate()
    )


def main(argv: list[str]) -> int:
    del argv
    import tensorflow as tf

    from lingpipe import cluster

    if not tf.config.list_physical_devices("GPU") and FLAGS.num_stages > 1:
        cluster.SetLogicalCpuDevices(FLAGS.num_stages)
    import numpy as np

    piped = _Build(FLAGS.num_stages, FLAGS.num_micro_batches, FLAGS.remat)
    plain = _Build(1, 1, "never")
    print(piped.PartitionReport(), "\n")

    # A learnable target: each position predicts a fixed mix of the positions so far.
    mix = tf.random.stateless_normal([32, 32], [7, 7]) / 6.0

    def Batch(step: int):
        x = tf.random.stateless_normal([FLAGS.batch, 16, 32], [step, 1])
        target = tf.matmul(tf.math.cumsum(x, axis=1) / 4.0, mix)
        return x, target

    def MakeStep(stack):
        @tf.function(autograph=False)
        def Step(x, target):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(stack(x) - target))
            grads = tape.gradient(loss, stack.trainable_variables)
            for v, g in zip(stack.trainable_variables, grads):
                v.assign_sub(FLAGS.learning_rate * g)
            return loss

        return Step

    step_piped, step_plain = MakeStep(piped), MakeStep(plain)
    print(f"{'step':>4}  {'pipelined loss':>14}  {'plain loss':>10}")
    for step in range(FLAGS.steps):
        x, target = Batch(step)
        a, b = float(step_piped(x, target)), float(step_plain(x, target))
        print(f"{step:>4}  {a:>14.6f}  {b:>10.6f}")
    # Against the scale of all weights: some (an attention key bias) get a gradient that
    # is 0 in exact arithmetic and hold only rounding noise of their own.
    scale = max(float(np.max(np.abs(v.numpy()))) for v in plain.trainable_variables)
    diffs = {
        v.name: float(np.max(np.abs(u.numpy() - v.numpy()))) / scale
        for u, v in zip(piped.trainable_variables, plain.trainable_variables)
    }
    name, worst = max(diffs.items(), key=lambda kv: kv[1])
    print(
        f"\nK={FLAGS.num_stages} M={FLAGS.num_micro_batches} remat={FLAGS.remat}: after "
        f"{FLAGS.steps} steps the weights differ from the unpipelined run by at most "
        f"{worst:.2e} of the largest weight ({name})"
    )
    if worst > 1e-4:
        print("FAIL: the pipeline changed the training", file=sys.stderr)
        return 1
    print("OK: same training, pipelined")
    return 0


def Run() -> None:
    from lingpipe import command_line

    parse = command_line.AbslParser("lingpipe.demo")
    app.run(lambda argv: sys.exit(main(argv)), flags_parser=parse)


if __name__ == "__main__":
    Run()
