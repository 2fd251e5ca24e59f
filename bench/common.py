"""Shared pieces of the pipeline benchmarks: models, one-configuration-per-process runs, tables.

Every measurement runs in a fresh process (`RunChild`): TensorFlow's memory
counters cover the whole process and its thread settings are fixed at start-up.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MODELS = {
    # Deep and activation-heavy, the regime GPipe is for: activations (16 x 8 MiB)
    # outweigh the weights (4 MiB) many times over.
    "mlp": dict(cells=16, batch=8192, dims=256),
    # A 16 x 1024 MLP at batch 1024: weights (64 MiB) as large as all the
    # activations, so the weight gradients set a floor that no recompute can lower.
    "mlp_wide": dict(cells=16, batch=1024, dims=1024),
    # A transformer stack: 8 pre-norm layers, 128 tokens per example.
    "transformer": dict(cells=8, batch=32, time=128, dims=256, heads=4, hidden=1024),
}

# Smaller sizes for timing many configurations on a 2-core machine.
SPEED_MODELS = {
    "mlp": dict(cells=8, batch=512, dims=512),
    "transformer": dict(cells=4, batch=16, time=64, dims=128, heads=4, hidden=512),
}


def UseSpeedSizes() -> None:
    MODELS.update({k: dict(v) for k, v in SPEED_MODELS.items()})


def Setup(num_devices: int, intra_op: int | None = None, inter_op: int | None = None) -> None:
    """Logical CPU devices and thread settings; must run before TensorFlow initializes."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from lingpipe import cluster

    cluster.SetLogicalCpuDevices(num_devices)
    if intra_op:
        tf.config.threading.set_intra_op_parallelism_threads(intra_op)
    if inter_op:
        tf.config.threading.set_inter_op_parallelism_threads(inter_op)


def CellParams(model: str, dtype: str = "float32"):
    """The model's cells; activations in `dtype` (weights stay float32)."""
    import tensorflow as tf

    from lingpipe.layers import linear, transformer

    cfg = MODELS[model]
    if model.startswith("mlp"):
        p = linear.ProjectionLayer.Params().Set(
            input_dims=cfg["dims"], output_dims=cfg["dims"], activation="RELU"
        )
    else:
        p = transformer.TransformerLayer.Params().Set(
            input_dims=cfg["dims"],
            num_heads=cfg["heads"],
            hidden_dims=cfg["hidden"],
            causal=True,
        )
    fprop_dtype = None if dtype == "float32" else tf.as_dtype(dtype)
    return [p.Copy().Set(fprop_dtype=fprop_dtype) for _ in range(cfg["cells"])]


def Inputs(model: str, dtype: str = "float32"):
    import tensorflow as tf

    cfg = MODELS[model]
    shape = [cfg["batch"], cfg["dims"]]
    if not model.startswith("mlp"):
        shape = [cfg["batch"], cfg["time"], cfg["dims"]]
    return (tf.cast(tf.random.stateless_normal(shape, [1, 2]), dtype),)


def Build(
    model: str,
    num_stages: int,
    num_micro_batches: int,
    remat: str,
    schedule: str = "gpipe",
    num_virtual_stages: int = 1,
    dtype: str = "float32",
):
    """A PipeliningLayer, or (num_stages == 0) the plain stack as a SequentialLayer."""
    from lingpipe.layers import gpipe, sequential

    cells = CellParams(model, dtype)
    if num_stages == 0:
        return sequential.SequentialLayer.Params().Set(name="plain", sub=cells).Instantiate()
    return (
        gpipe.PipeliningLayer.Params()
        .Set(
            name="pipe",
            cell_tpl=cells,
            num_stages=num_stages,
            num_micro_batches=num_micro_batches,
            remat=remat,
            schedule=schedule,
            num_virtual_stages=num_virtual_stages,
        )
        .Instantiate()
    )


def TrainStep(layer, executor: bool = False):
    """tf.function: loss and all gradients (alive together, as an optimizer needs them).

    The loss is the mean square of the outputs. executor=False differentiates
    `layer(x)` under a tape (fill-drain, GPipe); executor=True runs
    `layer.ForwardBackward`, which follows the layer's `schedule` (1F1B, ...).
    """
    import tensorflow as tf

    if executor:
        return _ExecutorStep(layer)

    @tf.function(autograph=False)
    def Step(*inputs):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.cast(layer(*inputs), tf.float32)))
        return loss, tape.gradient(loss, layer.trainable_variables)

    return Step


def _ExecutorStep(layer):
    import tensorflow as tf

    from lingpipe.nested_map import NestedMap

    def Loss(outputs, _):
        x = tf.cast(outputs, tf.float32)
        return NestedMap(loss=(tf.reduce_mean(tf.square(x)), tf.cast(tf.size(x), tf.float32)))

    @tf.function(autograph=False)
    def Step(*inputs):
        out = layer.ForwardBackward(layer.theta, inputs, Loss)
        return out.metrics.loss[0], tf.nest.flatten(out.theta_grads)

    return Step


def AdamStep(layer: Any, learning_rate: float = 1e-4) -> Any:
    """A tf.function training step of `layer` through its executor with lingpipe's Adam
    (slots built first, each beside its weight): Train(*inputs) -> loss."""
    import tensorflow as tf

    from lingpipe import optimizers

    variables = tf.nest.flatten(layer.theta)
    opt = optimizers.Adam.Params().Instantiate()
    opt.Build(variables)
    step = TrainStep(layer, executor=True)

    @tf.function(autograph=False)
    def Train(*inputs):
        loss, grads = step(*inputs)
        opt.Apply(grads, variables, learning_rate=learning_rate)
        return loss

    return Train


def Machine() -> dict[str, Any]:
    import tensorflow as tf

    return {
        "tf": tf.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "gpus": [d.name for d in tf.config.list_physical_devices("GPU")],
    }


def RunChild(script: str, args: list[str], timeout: int = 900) -> dict[str, Any]:
    """Runs `python script --child args...` and returns the JSON it prints last."""
    cmd = [sys.executable, script, "--child", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        return {"error": (done.stderr or done.stdout).strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def Table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    cells = [columns] + [[_Fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join("  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells)


def _Fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    return "-" if v is None else str(v)


def WriteJson(path: str, payload: dict[str, Any]) -> None:
    """Writes `payload` (with today's UTC date unless it has one: bench/tables.py shows it)."""
    import datetime

    payload = {"date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(), **payload}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=2)
    os.replace(tmp, path)  # never a half-written file
