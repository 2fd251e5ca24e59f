"""keras.applications models lingpipe did not write, pipelined by lingpipe.keras.Pipeline:
does each one cut, predict as the plain model and train?

    python bench/keras_applications.py                        # table + JSON
    python bench/keras_applications.py --models=VGG16,Xception --num_stages=4

Each model (weights=None, 10 classes, its smallest input size or 32x32) runs in a
process of its own, on logical CPU devices (or one accelerator per stage): it is
built, copied into a plain model with the same weights, pipelined over --num_stages
stages with 2 micro-batches, and then

  predict_max_abs_diff  max |pipelined - plain| of predict (training=False) on 8 images;
  fit_loss              the loss of one epoch of fit (16 images, batches of 8, SGD);
  seconds               the whole row (building, tracing and running).

A row that fails gives its error instead. This checks that the models run, not
that fit equals a reference: tests/keras/test_functional_applications.py does that
for ResNet50, MobileNetV2 and EfficientNetB0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import common  # noqa: E402

# Model -> input size: the smallest each accepts (Xception 71, InceptionV3 75), else 32.
MODELS = {
    "DenseNet121": 32,
    "EfficientNetB0": 32,
    "EfficientNetV2B0": 32,
    "ConvNeXtTiny": 32,
    "NASNetMobile": 32,
    "Xception": 71,
    "InceptionV3": 75,
    "MobileNetV3Small": 32,
    "VGG16": 32,
}


def Measure(name: str, size: int, num_stages: int) -> dict[str, Any]:
    """One row (see the module docstring); the devices must already be set up."""
    import keras
    import numpy as np

    import lingpipe.keras as lpk

    start = time.perf_counter()
    keras.utils.set_random_seed(3)
    model = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3), classes=10)
    plain = keras.models.clone_model(model)
    plain.set_weights(model.get_weights())
    rng = np.random.RandomState(0)
    x, y = rng.rand(16, size, size, 3).astype(np.float32), np.arange(16) % 10
    want = plain(x[:8], training=False).numpy()
    pipe = lpk.Pipeline(model, num_stages=num_stages, num_micro_batches=2)
    diff = float(np.max(np.abs(np.asarray(pipe(x[:8], training=False)) - want)))
    pipe.compile(optimizer=keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy")
    history = pipe.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    return {
        "model": name,
        "input": f"{size}x{size}",
        "layers": len(model.layers),
        "params_m": model.count_params() / 1e6,
        "predict_max_abs_diff": diff,
        "fit_loss": float(history.history["loss"][-1]),
        "seconds": time.perf_counter() - start,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated names")
    ap.add_argument("--num_stages", type=int, default=2, help="stages (devices) of the pipeline")
    ap.add_argument("--in_process", action="store_true", help="every row in this process")
    ap.add_argument("--out", default="", help="JSON path (default bench/results/...json)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        ap.error(f"expected --models from {', '.join(MODELS)}, received --models={args.models}")
    if args.child or args.in_process:
        from lingpipe.keras import model_base

        # Logical CPU devices, unless the process has enough already (a test's 8).
        model_base.EnsureDevices(args.num_stages, None, "bench/keras_applications.py")
    if args.child:
        print(json.dumps(Measure(names[0], MODELS[names[0]], args.num_stages)))
        return 0
    rows = []
    for name in names:
        if args.in_process:
            rows.append(Measure(name, MODELS[name], args.num_stages))
        else:
            script = os.path.abspath(__file__)
            row = common.RunChild(script, [f"--models={name}", f"--num_stages={args.num_stages}"])
            rows.append({"model": name, **row})
    print(f"keras_applications: {args.num_stages} stages, 2 micro-batches, weights=None")
    columns = ["model", "input", "layers", "params_m", "predict_max_abs_diff", "fit_loss"]
    print(common.Table(rows, columns + ["seconds", "error"]))
    here = os.path.dirname(os.path.abspath(__file__))
    out = args.out or os.path.join(here, "results", "keras_applications.json")
    common.WriteJson(out, {"machine": common.Machine(), "rows": rows})
    print(f"wrote {out}")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
