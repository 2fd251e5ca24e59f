"""A Keras ResNet pipelined over 2 stages beside the same model unpipelined: the step
time and peak memory of `train_on_batch` (SGD with momentum).

    python bench/keras_models.py                    # table + bench/results/keras_models.json
    python bench/keras_models.py --model=resnet50   # keras.applications.ResNet50, 32x32
    python bench/keras_models.py --smoke            # the seconds-long run of the tests

Models:
  resnet_blocks  a ResNet-style stack (stem conv, residual blocks of two 3x3 convs with
                 a projection on the skip when the shape changes, global pooling, dense)
                 written as Keras layers, pipelined by lingpipe.keras.PipelinedSequential;
                 the plain row is a keras.Sequential of the same layers and weights.
  resnet50       keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3),
                 classes=10), pipelined by lingpipe.keras.Pipeline (the Functional-model
                 pipeline); the plain row is the model itself.

Each row runs in its own process (TensorFlow's memory counters cover the whole
process): on CPU the process splits the CPU into 2 logical devices, which share one
allocator, so the peak is the process' (all stages together); with one GPU it splits
the GPU into 2 logical GPUs of --gpu_mib each and reports each device's peak. Rows:
step_ms (median of --steps timed steps after 2 warm-up steps), peak_mib (the largest
device peak during the timed steps), step_peak_mib (that peak minus the memory in use
before them: the step's own activations and gradients), final_loss (the last step's
loss, from the same initial weights and data: equal for resnet_blocks; ResNet50's
batch norm normalizes each micro-batch with its own moments under the pipeline, so
its losses differ a little).
`--smoke` runs both rows in this process at toy sizes, to test the script: its
numbers compare nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import common  # noqa: E402

MIB = 1024 * 1024
SIZES = {
    "resnet_blocks": dict(image=32, filters=[16, 16, 32, 32, 64, 64], batch=64, micro=4),
    "resnet50": dict(image=32, filters=None, batch=64, micro=4),
    "smoke": dict(image=16, filters=[8, 16], batch=16, micro=2),
}
NUM_STAGES = 2
CLASSES = 10


def _Keras() -> Any:
    import keras

    @keras.saving.register_keras_serializable(package="lingpipe_bench")
    class ResidualBlock(keras.layers.Layer):
        """relu(conv3x3(relu(conv3x3(x))) + skip(x)); skip: a strided 1x1 conv when the
        filters or the stride change, else x. inputs [batch, h, w, c] ->
        [batch, h/strides, w/strides, filters]."""

        def __init__(self, filters: int, strides: int = 1, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.filters, self.strides = filters, strides
            conv = keras.layers.Conv2D
            self.conv1 = conv(filters, 3, strides=strides, padding="same", activation="relu")
            self.conv2 = conv(filters, 3, padding="same")
            self.project = None

        def build(self, input_shape: Any) -> None:
            self.conv1.build(input_shape)
            self.conv2.build(self.conv1.compute_output_shape(input_shape))
            if input_shape[-1] != self.filters or self.strides != 1:
                self.project = keras.layers.Conv2D(self.filters, 1, strides=self.strides)
                self.project.build(input_shape)

        def call(self, inputs: Any) -> Any:
            skip = inputs if self.project is None else self.project(inputs)
            return keras.ops.relu(self.conv2(self.conv1(inputs)) + skip)

        def compute_output_shape(self, input_shape: Any) -> tuple:
            return self.conv1.compute_output_shape(input_shape)[:-1] + (self.filters,)

        def get_config(self) -> dict:
            return dict(super().get_config(), filters=self.filters, strides=self.strides)

    return keras, ResidualBlock


def BlockLayers(cfg: dict) -> list:
    """The resnet_blocks model's layers: a stride 2 wherever the filters grow."""
    keras, ResidualBlock = _Keras()
    filters = cfg["filters"]
    layers = [keras.layers.Conv2D(filters[0], 3, padding="same", activation="relu")]
    for prev, f in zip(filters[:1] + filters[:-1], filters):
        layers.append(ResidualBlock(f, strides=2 if f > prev else 1))
    return layers + [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(CLASSES)]


def Plain(name: str, cfg: dict) -> Any:
    """The unpipelined Keras model."""
    import keras

    shape = (cfg["image"], cfg["image"], 3)
    if name == "resnet50":
        return keras.applications.ResNet50(weights=None, input_shape=shape, classes=CLASSES)
    return keras.Sequential([keras.Input(shape)] + BlockLayers(cfg))


def Pipelined(name: str, cfg: dict, plain: Any) -> Any:
    """The same model over NUM_STAGES stages, starting from `plain`'s weights."""
    import lingpipe.keras as lpk

    if name == "resnet50":
        if not hasattr(lpk, "Pipeline"):
            raise RuntimeError("lingpipe.keras.Pipeline is not in this checkout")
        return lpk.Pipeline(plain, num_stages=NUM_STAGES, num_micro_batches=cfg["micro"])
    model = lpk.PipelinedSequential(
        BlockLayers(cfg),
        num_stages=NUM_STAGES,
        num_micro_batches=cfg["micro"],
        partition="flops",
        input_shape=(cfg["image"], cfg["image"], 3),
    )
    model.set_weights(plain.get_weights())
    return model


def _Devices() -> list[str]:
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    return [d.name.split("device:")[-1] for d in gpus] or ["CPU:0"]


def Measure(name: str, cfg: dict, pipelined: bool, steps: int) -> dict:
    """One row: builds (the same initial weights in every process), compiles, warms up,
    then times `steps` train_on_batch calls."""
    import keras
    import numpy as np
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = Plain(name, cfg)
    if pipelined:
        model = Pipelined(name, cfg, model)
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss="mse")
    rng = np.random.RandomState(0)
    x = rng.randn(cfg["batch"], cfg["image"], cfg["image"], 3).astype(np.float32)
    y = rng.randn(cfg["batch"], CLASSES).astype(np.float32)
    for _ in range(2):  # traces, then one step more
        model.train_on_batch(x, y)
    devices = _Devices()
    current = {}
    for d in devices:
        tf.config.experimental.reset_memory_stats(d)
        current[d] = tf.config.experimental.get_memory_info(d)["current"]
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = model.train_on_batch(x, y)
        times.append(time.perf_counter() - start)
    peaks = {d: tf.config.experimental.get_memory_info(d)["peak"] for d in devices}
    top = max(peaks, key=peaks.get)
    return {
        "row": f"{name} " + (f"K={NUM_STAGES} M={cfg['micro']}" if pipelined else "plain"),
        "params_m": model.count_params() / 1e6,
        "step_ms": 1000 * statistics.median(times),
        "peak_mib": peaks[top] / MIB,
        "step_peak_mib": (peaks[top] - current[top]) / MIB,
        "devices": devices,
        "final_loss": float(loss),
    }


def Setup(gpu_mib: int) -> None:
    """2 devices for the stages: logical CPUs, or one GPU split in 2 of gpu_mib each."""
    import tensorflow as tf

    from lingpipe.keras import model_base

    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) == 1:
        limit = [tf.config.LogicalDeviceConfiguration(memory_limit=gpu_mib)] * NUM_STAGES
        tf.config.set_logical_device_configuration(gpus[0], limit)
    else:  # CPU only: logical devices, unless this process already has enough
        model_base.EnsureDevices(NUM_STAGES, None, "bench/keras_models.py")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="resnet_blocks", help="resnet_blocks or resnet50")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per row")
    ap.add_argument("--gpu_mib", type=int, default=30000, help="memory of each logical GPU")
    ap.add_argument("--smoke", action="store_true", help="toy sizes, in this process")
    ap.add_argument("--out", default="", help="JSON path (default bench/results/keras_models.json)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--pipelined", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.model not in ("resnet_blocks", "resnet50"):
        ap.error(f"expected --model resnet_blocks or resnet50, received --model={args.model}")
    import json

    cfg = dict(SIZES["smoke" if args.smoke else args.model])
    if args.child or args.smoke:
        Setup(args.gpu_mib)
    if args.child:
        print(json.dumps(Measure(args.model, cfg, bool(args.pipelined), args.steps)))
        return 0
    if args.smoke:
        rows = [Measure(args.model, cfg, p, args.steps) for p in (False, True)]
    else:
        script = os.path.abspath(__file__)
        common_args = [
            f"--model={args.model}",
            f"--steps={args.steps}",
            f"--gpu_mib={args.gpu_mib}",
        ]
        rows = [common.RunChild(script, common_args + [f"--pipelined={p}"]) for p in (0, 1)]
        for r, p in zip(rows, (0, 1)):
            r.setdefault("row", f"{args.model} {'pipelined' if p else 'plain'}")
    if "step_ms" in rows[0] and "step_ms" in rows[1]:
        rows[1]["vs_plain_time"] = rows[1]["step_ms"] / rows[0]["step_ms"]
        rows[1]["vs_plain_peak"] = rows[1]["step_peak_mib"] / max(rows[0]["step_peak_mib"], 1e-9)
    how = "smoke (one process: numbers compare nothing)" if args.smoke else "a process per row"
    print(
        f"keras_models: {args.model}, batch {cfg['batch']} of {cfg['image']}x{cfg['image']}x3, "
        f"SGD; {how}"
    )
    columns = ["row", "params_m", "step_ms", "peak_mib", "step_peak_mib", "final_loss"]
    print(common.Table(rows, columns + ["vs_plain_time", "vs_plain_peak", "error"]))
    out = args.out or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results", "keras_models.json"
    )
    payload = {"machine": common.Machine(), "model": args.model, "size": cfg, "rows": rows}
    common.WriteJson(out, dict(payload, smoke=args.smoke))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
