"""The Keras conformance table: each Keras training feature, its model and how it is run.

`tests/keras/test_conformance.py` runs every row through `lingpipe.keras.Pipeline`
against the same plain model (fit's weights and history, evaluate, predict), and every
refusal for its one line; `tests/test_readme.py` checks that README's Keras section
lists each row. A row is a `Feature`: the model it builds, how it compiles and fits,
and the tolerance it must meet (float32 rounding, or float16's under mixed precision).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

VOCAB, TIME, DIMS, CLASSES = 13, 6, 8, 3
ROWS = 32  # examples: fit runs batches of 16 (2 steps an epoch), 2 epochs


def _Seed() -> None:
    keras.utils.set_random_seed(7)


# ---- Models (each with enough layers for zbv's four stages) -------------------------


def DenseModel(output_dtype: Any = None, classes: int = CLASSES) -> keras.Model:
    """[batch, 8] -> logits [batch, classes]."""
    _Seed()
    x = keras.Input((8,), name="x")
    h = keras.layers.Dense(16, activation="relu", name="d1")(x)
    h = keras.layers.Dense(16, activation="tanh", name="d2")(h)
    h = keras.layers.Dense(16, activation="relu", name="d3")(h)
    y = keras.layers.Dense(classes, name="out", dtype=output_dtype)(h)
    return keras.Model(x, y, name="dense")


@keras.saving.register_keras_serializable(package="lingpipe_conformance")
class MeanSquarePenalty(keras.layers.Layer):
    """Passes its input on and adds rate * mean(x^2) with add_loss."""

    def __init__(self, rate: float = 0.1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rate = rate

    def call(self, x: Any) -> Any:
        self.add_loss(self.rate * keras.ops.mean(keras.ops.square(x)))
        return x

    def get_config(self) -> dict:
        return dict(super().get_config(), rate=self.rate)


def LayerLossModel() -> keras.Model:
    """An activity regularizer on the first stage and an add_loss layer on the last."""
    _Seed()
    x = keras.Input((8,), name="x")
    h = keras.layers.Dense(16, activation="relu", name="d1", activity_regularizer="l2")(x)
    h = keras.layers.Dense(16, activation="tanh", name="d2")(h)
    h = keras.layers.Dense(16, activation="relu", name="d3")(h)
    h = MeanSquarePenalty(0.05, name="penalty")(h)
    y = keras.layers.Dense(CLASSES, name="out")(h)
    return keras.Model(x, y, name="layer_losses")


def TokenModel(mask_zero: bool = False) -> keras.Model:
    """int32 ids [batch, time] into a float32 Input, as keras.io's examples feed them ->
    per-token logits [batch, time, VOCAB]; with mask_zero the mask reaches the output."""
    _Seed()
    ids = keras.Input((None,), name="ids")
    h = keras.layers.Embedding(VOCAB, DIMS, mask_zero=mask_zero, name="embed")(ids)
    h = keras.layers.Dense(DIMS, activation="relu", name="d1")(h)
    h = keras.layers.Dense(DIMS, activation="tanh", name="d2")(h)
    h = keras.layers.Dense(DIMS, activation="relu", name="d3")(h)
    y = keras.layers.Dense(VOCAB, name="out")(h)
    return keras.Model(ids, y, name="tokens")


def PooledTokenModel() -> keras.Model:
    """int32 ids [batch, time] -> class logits [batch, CLASSES] (an embedding with Adam)."""
    _Seed()
    ids = keras.Input((TIME,), dtype="int32", name="ids")
    h = keras.layers.Embedding(VOCAB, DIMS, name="embed")(ids)
    h = keras.layers.Dense(DIMS, activation="relu", name="d1")(h)
    h = keras.layers.GlobalAveragePooling1D(name="pool")(h)
    h = keras.layers.Dense(DIMS, activation="tanh", name="d2")(h)
    y = keras.layers.Dense(CLASSES, name="out")(h)
    return keras.Model(ids, y, name="pooled_tokens")


def DictModel() -> keras.Model:
    """Inputs {'ids': int32 [batch, TIME], 'extra': [batch, 4]} -> logits [batch, CLASSES]."""
    _Seed()
    ids = keras.Input((TIME,), dtype="int32", name="ids")
    extra = keras.Input((4,), name="extra")
    h = keras.layers.Embedding(VOCAB, DIMS, name="embed")(ids)
    h = keras.layers.GlobalAveragePooling1D(name="pool")(h)
    h = keras.layers.Concatenate(name="join")([h, extra])
    h = keras.layers.Dense(16, activation="relu", name="d1")(h)
    y = keras.layers.Dense(CLASSES, name="out")(h)
    return keras.Model({"ids": ids, "extra": extra}, y, name="dict_inputs")


def TwoOutputModel() -> keras.Model:
    """[batch, 8] -> [logits [batch, CLASSES] ('label'), a score [batch, 1] ('score')]."""
    _Seed()
    x = keras.Input((8,), name="x")
    h = keras.layers.Dense(16, activation="relu", name="d1")(x)
    h = keras.layers.Dense(16, activation="tanh", name="d2")(h)
    h = keras.layers.Dense(16, activation="relu", name="d3")(h)
    label = keras.layers.Dense(CLASSES, name="label")(h)
    return keras.Model(x, [label, keras.layers.Dense(1, name="score")(h)], name="two_outputs")


# ---- Data ------------------------------------------------------------------------


def DenseData(rows: int = ROWS) -> tuple:
    rng = np.random.RandomState(0)
    return rng.randn(rows, 8).astype("float32"), rng.randint(0, CLASSES, rows)


def TokenData(rows: int = ROWS, padded: bool = False) -> tuple:
    """int32 ids and next-token targets; `padded`: each row ends in 0 to TIME-1 pads
    (uneven across micro-batches)."""
    rng = np.random.RandomState(1)
    ids = rng.randint(1, VOCAB, (rows, TIME)).astype("int32")
    if padded:
        for r, length in enumerate(rng.randint(1, TIME + 1, rows)):
            ids[r, length:] = 0
    return ids, rng.randint(0, VOCAB, (rows, TIME))


def DictData(rows: int = ROWS) -> tuple:
    rng = np.random.RandomState(2)
    x = {
        "ids": rng.randint(0, VOCAB, (rows, TIME)).astype("int32"),
        "extra": rng.randn(rows, 4).astype("float32"),
    }
    return x, rng.randint(0, CLASSES, rows)


def SparseCe() -> keras.losses.Loss:
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


# ---- The table -------------------------------------------------------------------


@dataclasses.dataclass
class Feature:
    """One row: `model()` builds a fresh model (the same weights each call); `compile()`
    gives compile's keyword arguments; `data()` gives (x, y) or {'x': ..., ...} for fit."""

    model: Callable[[], keras.Model]
    compile: Callable[[], dict]
    data: Callable[[], Any]
    fit: Callable[[], dict] = dict  # fit's other keyword arguments (callbacks are stateful)
    schedules: tuple = ("gpipe", "1f1b", "zbv")
    sequential: bool = False  # also through PipelinedSequential (a DenseModel's layers)
    tolerance: float = 1e-5
    policy: str = "float32"
    num_micro_batches: int = 2
    eval_batch: int = 16  # evaluate's and predict's batch size


def _Sgd(**kwargs: Any) -> Callable[[], dict]:
    def Make() -> dict:
        optimizer = keras.optimizers.SGD(0.1, **kwargs)
        return dict(optimizer=optimizer, loss=SparseCe())

    return Make


def _With(optimizer: Callable[[], Any], **extra: Any) -> Callable[[], dict]:
    return lambda: dict(optimizer=optimizer(), loss=SparseCe(), **extra)


def _Regularized(model: keras.Model) -> keras.Model:
    """`model` with an L2 kernel regularizer on its first and last Dense layers."""
    for name in ("d1", "out"):
        model.get_layer(name).kernel_regularizer = keras.regularizers.L2(0.01)
    return model


def _Pooled() -> tuple:
    ids, _ = TokenData()
    return ids, np.random.RandomState(3).randint(0, CLASSES, len(ids))


def _Optimizer(name: str, **kwargs: Any) -> Callable[[], dict]:
    make = {
        "sgd": lambda: keras.optimizers.SGD(0.1, **kwargs),
        "adam": lambda: keras.optimizers.Adam(0.01, **kwargs),
        "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.05, **kwargs),
        "rmsprop": lambda: keras.optimizers.RMSprop(0.01, **kwargs),
        "adafactor": lambda: keras.optimizers.Adafactor(0.01, **kwargs),
    }[name]
    return _With(make)


FEATURES: dict[str, Feature] = {
    "float32, SGD with momentum": Feature(
        DenseModel, _Sgd(momentum=0.9), DenseData, sequential=True
    ),
    "mixed_float16 with loss scaling": Feature(
        lambda: DenseModel(output_dtype="float32"),
        _Sgd(),
        DenseData,
        tolerance=2e-3,
        policy="mixed_float16",
        sequential=True,
    ),
    "mixed_float16, dynamic scaling skips overflowing steps": Feature(
        lambda: DenseModel(output_dtype="float32"),
        # Scaled by 2^21, the first 3 of the 4 steps overflow float16 and are skipped
        # (the scale halves each time); the last one applies.
        _With(
            lambda: keras.optimizers.LossScaleOptimizer(
                keras.optimizers.SGD(0.1), initial_scale=2.0**21
            )
        ),
        DenseData,
        tolerance=2e-3,
        policy="mixed_float16",
    ),
    "mixed_bfloat16": Feature(
        lambda: DenseModel(output_dtype="float32"),
        _Sgd(),
        DenseData,
        tolerance=3e-2,
        policy="mixed_bfloat16",
    ),
    "add_loss and activity regularizers": Feature(LayerLossModel, _Sgd(), DenseData),
    # keras.io's captcha OCR example: its CTC loss is a layer's add_loss.
    "compiled without a loss: the layers' losses alone": Feature(
        LayerLossModel, lambda: dict(optimizer=keras.optimizers.SGD(0.1)), DenseData
    ),
    "kernel regularizers": Feature(lambda: _Regularized(DenseModel()), _Sgd(), DenseData),
    "masked token loss, uneven padding": Feature(
        lambda: TokenModel(mask_zero=True),
        _Sgd(),
        lambda: TokenData(padded=True),
    ),
    "sample_weight": Feature(
        DenseModel,
        _Sgd(),
        lambda: dict(zip(("x", "y"), DenseData()), sample_weight=np.linspace(0.1, 2.0, ROWS)),
    ),
    "loss reduction 'sum'": Feature(
        DenseModel,
        lambda: dict(
            optimizer=keras.optimizers.SGD(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum"),
        ),
        DenseData,
    ),
    "loss reduction 'mean_with_sample_weight'": Feature(
        DenseModel,
        lambda: dict(
            optimizer=keras.optimizers.SGD(0.1),
            loss=keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, reduction="mean_with_sample_weight"
            ),
        ),
        lambda: dict(zip(("x", "y"), DenseData()), sample_weight=np.linspace(0.1, 2.0, ROWS)),
    ),
    "class_weight": Feature(
        DenseModel,
        _Sgd(),
        DenseData,
        fit=lambda: dict(class_weight={0: 0.5, 1: 2.0, 2: 1.0}),
        sequential=True,
    ),
    "embedding gradients as slices, SGD": Feature(PooledTokenModel, _Optimizer("sgd"), _Pooled),
    "embedding gradients as slices, Adam": Feature(PooledTokenModel, _Optimizer("adam"), _Pooled),
    "embedding gradients as slices, AdamW": Feature(PooledTokenModel, _Optimizer("adamw"), _Pooled),
    "embedding gradients as slices, RMSprop": Feature(
        PooledTokenModel, _Optimizer("rmsprop"), _Pooled
    ),
    "clipnorm": Feature(DenseModel, _Optimizer("sgd", clipnorm=0.05), DenseData),
    "clipvalue": Feature(DenseModel, _Optimizer("sgd", clipvalue=0.01), DenseData),
    "global_clipnorm over every stage": Feature(
        DenseModel,
        _Optimizer("sgd", global_clipnorm=0.05),
        DenseData,
        sequential=True,
    ),
    "gradient_accumulation_steps": Feature(
        DenseModel, _Optimizer("adam", gradient_accumulation_steps=2), DenseData
    ),
    "use_ema": Feature(DenseModel, _Optimizer("adam", use_ema=True), DenseData),
    # Adafactor builds its slots by keyword (reference_variable=) and factors them.
    "Adafactor": Feature(DenseModel, _Optimizer("adafactor"), DenseData, schedules=("gpipe",)),
    "weight_decay": Feature(DenseModel, _Optimizer("sgd", weight_decay=0.1), DenseData),
    "run_eagerly": Feature(
        DenseModel, _With(lambda: keras.optimizers.SGD(0.1), run_eagerly=True), DenseData
    ),
    "steps_per_execution": Feature(
        DenseModel, _With(lambda: keras.optimizers.SGD(0.1), steps_per_execution=2), DenseData
    ),
    "outputs as a list: losses, loss_weights and metrics named by output": Feature(
        TwoOutputModel,
        lambda: dict(
            optimizer=keras.optimizers.SGD(0.1),
            loss=[SparseCe(), "mse"],
            loss_weights=[1.0, 0.5],
            metrics=[["accuracy"], ["mae"]],
        ),
        lambda: (DenseData()[0], [DenseData()[1], DenseData()[0][:, :1]]),
    ),
    "int32 ids into a float32 Input": Feature(TokenModel, _Sgd(), TokenData),
    "dict inputs": Feature(DictModel, _Sgd(), DictData),
    "stateful metrics (AUC, Precision)": Feature(
        lambda: DenseModel(classes=1),
        lambda: dict(
            optimizer=keras.optimizers.SGD(0.1),
            loss=keras.losses.BinaryCrossentropy(from_logits=True),
            metrics=[keras.metrics.AUC(from_logits=True), keras.metrics.Precision(thresholds=0.0)],
        ),
        lambda: (DenseData()[0], (DenseData()[1] > 0).astype("float32")[:, None]),
    ),
    "LearningRateScheduler and ReduceLROnPlateau": Feature(
        DenseModel,
        _Sgd(),
        DenseData,
        fit=lambda: dict(
            callbacks=[
                keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.5),
                keras.callbacks.ReduceLROnPlateau("loss", factor=0.5, patience=0, min_delta=10),
            ]
        ),
    ),
    "tf.data with sequence lengths changing between batches": Feature(
        TokenModel, _Sgd(), lambda: dict(x=_ChangingLengths())
    ),
    "validation_split and a partial last batch": Feature(
        DenseModel,
        _Sgd(),
        lambda: DenseData(ROWS + 5),
        fit=lambda: dict(validation_split=0.25),
        num_micro_batches=4,
    ),
    "evaluate and predict with a last batch smaller than M": Feature(
        DenseModel,
        _Sgd(),
        lambda: DenseData(36),
        num_micro_batches=4,
        eval_batch=7,  # 36 rows: five batches of 7, then one of 1 row
        sequential=True,
    ),
}


def _ChangingLengths() -> Any:
    """Batches of 8 token rows whose length changes from batch to batch (6, 3, 6, 4)."""
    import tensorflow as tf

    ids, targets = TokenData()
    batches = [
        (ids[i : i + 8, :t], targets[i : i + 8, :t])
        for i, t in zip(range(0, ROWS, 8), (6, 3, 6, 4))
    ]
    return tf.data.Dataset.from_generator(
        lambda: iter(batches),
        output_signature=(
            tf.TensorSpec((None, None), tf.int32),
            tf.TensorSpec((None, None), tf.int64),
        ),
    )


# ---- Running a row -----------------------------------------------------------------


def _Relative(a: Any, b: Any) -> float:
    """max |a - b| over max |b|: a difference on the scale of the reference (the largest
    over the outputs, for a model with several)."""
    if isinstance(b, (list, tuple, dict)):
        return max(_Relative(x, y) for x, y in zip(keras.tree.flatten(a), keras.tree.flatten(b)))
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b), initial=0.0) / max(np.max(np.abs(b), initial=0.0), 1e-6))


def _ByName(results: dict) -> dict:
    """Results keyed without Keras' counter suffix ('auc_1' -> 'auc'): the two models'
    metric objects are made one after the other."""
    import re

    return {re.sub(r"_\d+$", "", k): v for k, v in results.items()}


def Pipelined(feature: Feature, schedule: str, front: str) -> keras.Model:
    """The feature's model as `front` ('Pipeline' or 'PipelinedSequential') over 2 devices,
    with the plain model's weights."""
    import lingpipe.keras as lpk

    base = feature.model()
    knobs = dict(num_stages=2, num_micro_batches=feature.num_micro_batches, schedule=schedule)
    if front == "Pipeline":
        return lpk.Pipeline(base, **knobs)
    piped = lpk.PipelinedSequential(base.layers[1:], input_shape=base.input_shape[1:], **knobs)
    piped.set_weights(base.get_weights())
    return piped


def _Run(model: keras.Model, feature: Feature, inference: bool = True) -> dict:
    """The model compiled, fitted, evaluated and predicted as the feature says: its
    weights, history, evaluate's results and predictions (the last two for arrays and
    `inference`)."""
    model.compile(**feature.compile())
    data = feature.data()
    args = data if isinstance(data, dict) else dict(x=data[0], y=data[1])
    batched = not hasattr(args["x"], "element_spec")
    options = dict(epochs=2, verbose=0, **feature.fit())
    if batched:
        options.update(batch_size=16, shuffle=False)
    out = dict(history=_ByName(model.fit(**args, **options).history))
    out["weights"] = model.get_weights()
    if batched and inference:
        evaluate = dict(verbose=0, batch_size=feature.eval_batch, return_dict=True)
        out["evaluate"] = _ByName(model.evaluate(args["x"], args.get("y"), **evaluate))
        out["predict"] = model.predict(args["x"], batch_size=feature.eval_batch, verbose=0)
    return out


_PLAIN: dict = {}  # id(feature) -> the plain model's _Run: one per process and feature


def Compare(
    feature: Feature, schedule: str, front: str = "Pipeline", inference: bool = True
) -> dict[str, float]:
    """Fits the plain model and its pipeline (`front`, 2 devices) on the same data, and
    with `inference` evaluates and predicts; returns the largest relative difference of
    each: weights, history, evaluate, predict."""
    keras.mixed_precision.set_global_policy(feature.policy)
    try:
        if id(feature) not in _PLAIN:
            _PLAIN[id(feature)] = _Run(feature.model(), feature)
        pipelined = Pipelined(feature, schedule, front)
        plain, piped = _PLAIN[id(feature)], _Run(pipelined, feature, inference)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    figures = {
        "weights": max(_Relative(a, b) for a, b in zip(piped["weights"], plain["weights"])),
        "history": max(_Relative(piped["history"][k], v) for k, v in plain["history"].items()),
    }
    if "evaluate" in piped:
        ev = plain["evaluate"]
        figures["evaluate"] = max(_Relative(piped["evaluate"][k], v) for k, v in ev.items())
        figures["predict"] = _Relative(piped["predict"], plain["predict"])
    return figures


# ---- Refusals: one line before any training step ------------------------------------


def _FitTwoSteps(model: keras.Model, data: Any = None, **compile_kwargs: Any) -> None:
    model.compile(**dict(dict(optimizer="sgd", loss=SparseCe()), **compile_kwargs))
    x, y = data or DenseData()
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)


def Refuse(what: str) -> None:
    """Triggers the refusal `what` (a key of REFUSALS)."""
    import lingpipe.keras as lpk

    if what == "compile(jit_compile=True)":
        lpk.Pipeline(DenseModel(), num_stages=2, num_micro_batches=2).compile(
            optimizer="sgd", loss=SparseCe(), jit_compile=True
        )
    elif what == "a layer's loss in PipelinedSequential":
        layers = DenseModel().layers[1:]
        layers[0].activity_regularizer = keras.regularizers.L2(0.01)
        _FitTwoSteps(lpk.PipelinedSequential(layers, 2, 2, input_shape=(8,)))
    elif what == "a Keras-masked output beside layers' losses":
        _Seed()
        ids = keras.Input((TIME,), dtype="int32")
        h = keras.layers.Embedding(VOCAB, DIMS, mask_zero=True)(ids)
        h = keras.layers.Dense(DIMS, activity_regularizer="l2")(h)
        model = keras.Model(ids, keras.layers.Dense(VOCAB)(h))
        _FitTwoSteps(lpk.Pipeline(model, 2, 2), TokenData(padded=True))
    elif what == "a subclassed model in PipelinedSequential":

        class Subclassed(keras.Model):
            def call(self, x):
                return x

        lpk.PipelinedSequential([Subclassed()], 2, 2, input_shape=(8,))
    elif what == "a fit batch smaller than num_micro_batches":
        _FitTwoSteps(lpk.Pipeline(DenseModel(), 2, 4), DenseData(ROWS + 1))
    elif what == "a tf.data fit batch smaller than num_micro_batches":
        import tensorflow as tf

        x, y = DenseData(ROWS + 1)
        model = lpk.Pipeline(DenseModel(), 2, 4)
        model.compile(optimizer="sgd", loss=SparseCe())
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), verbose=0)
    elif what == "a dict input without one of its keys":
        x, y = DictData()
        _FitTwoSteps(lpk.Pipeline(DictModel(), 2, 2), ({"ids": x["ids"]}, y))
    elif what == "a layer that assigns its trainable weights (SpectralNormalization)":
        _Seed()
        x = keras.Input((8,), name="x")
        h = keras.layers.Dense(16, activation="relu", name="d1")(x)
        dense = keras.layers.Dense(16, activation="relu")
        h = keras.layers.SpectralNormalization(dense, name="spectral")(h)
        model = keras.Model(x, keras.layers.Dense(CLASSES, name="out")(h))
        _FitTwoSteps(lpk.Pipeline(model, 2, 2))
    elif what == "a model class that overrides compute_loss":

        class OwnLoss(keras.Model):
            def compute_loss(self, *args: Any, **kwargs: Any) -> Any:
                return 2.0 * super().compute_loss(*args, **kwargs)

        plain = DenseModel()
        lpk.Pipeline(OwnLoss(plain.input, plain.output, name="own_loss"), 2, 2)
    elif what == "a nested model class that overrides call":

        class OwnCall(keras.Model):
            def call(self, inputs: Any, training: Any = None, mask: Any = None) -> Any:
                return 2.0 * super().call(inputs, training=training, mask=mask)

        inner = DenseModel()
        x = keras.Input((8,), name="x")
        y = OwnCall(inner.input, inner.output, name="own_call")(x)
        lpk.Pipeline(keras.Model(x, keras.layers.Dense(CLASSES, name="head")(y)), 2, 2)
    elif what == "a sparse input (tf.SparseTensor)":
        import tensorflow as tf

        _Seed()
        x = keras.Input((8,), sparse=True, name="x")
        model = keras.Model(x, keras.layers.Dense(CLASSES, name="out")(keras.layers.Dense(16)(x)))
        data, labels = DenseData()
        _FitTwoSteps(lpk.Pipeline(model, 2, 2), (tf.sparse.from_dense(data), labels))
    elif what == "outputs' losses reduced differently":
        x, y = DenseData()
        _FitTwoSteps(
            lpk.Pipeline(TwoOutputModel(), 2, 2),
            (x, [y, x[:, :1]]),
            loss=[
                keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum"),
                "mse",
            ],
        )
    elif what == "a loss with reduction=None":
        none = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
        _FitTwoSteps(lpk.Pipeline(DenseModel(), 2, 2), loss=none)
    elif what == "a batch norm called on two stages":
        _Seed()
        x = keras.Input((8,), name="x")
        norm = keras.layers.BatchNormalization(name="shared_norm")
        h = norm(keras.layers.Dense(8, name="d1")(x))
        h = norm(keras.layers.Dense(8, name="d2")(h))
        model = keras.Model(x, keras.layers.Dense(CLASSES, name="out")(h))
        _FitTwoSteps(lpk.Pipeline(model, 2, 2, split_points=["d2"]))
    elif what == "a stateful RNN":
        _Seed()
        x = keras.Input(batch_shape=(16, TIME, DIMS), name="x")
        h = keras.layers.Dense(DIMS, name="d1")(x)
        h = keras.layers.GRU(DIMS, stateful=True, name="gru")(h)
        lpk.Pipeline(keras.Model(x, keras.layers.Dense(CLASSES, name="out")(h)), 2, 2)


# what -> (exception type, a regular expression its one-line message matches).
REFUSALS: dict[str, tuple[type, str]] = {
    "compile(jit_compile=True)": (ValueError, r"XLA, which cannot span the stages' devices"),
    "a layer's loss in PipelinedSequential": (
        ValueError,
        r"adds a loss .* use lingpipe.keras.Pipeline",
    ),
    "a Keras-masked output beside layers' losses": (
        ValueError,
        r"an output with a Keras mask and losses added by layers",
    ),
    "a subclassed model in PipelinedSequential": (
        TypeError,
        r"received a subclassed keras.Model .* pass model.layers",
    ),
    "a fit batch smaller than num_micro_batches": (
        ValueError,
        r"fit's last batch would hold 1 rows \(33 rows in batches of 16\), fewer than "
        r"num_micro_batches=4",
    ),
    # Known only when that batch comes (at the end of the epoch): the model named once.
    "a tf.data fit batch smaller than num_micro_batches": (
        ValueError,
        r"^Pipeline '[\w]+': batch 1 is smaller than num_micro_batches=4; give batches of "
        r"at least 4 rows",
    ),
    # Keras' own message, as the plain model gives it.
    "a dict input without one of its keys": (
        ValueError,
        r'Missing data for input "extra"\. .* Expected the following keys',
    ),
    # Its forward in training writes the normalized kernel into the trainable kernel.
    "a layer that assigns its trainable weights (SpectralNormalization)": (
        ValueError,
        r"SpectralNormalization 'spectral' assigns its trainable weight '[\w/]*kernel' in "
        r"its call",
    ),
    "a model class that overrides compute_loss": (
        ValueError,
        r"OwnLoss 'own_loss' overrides keras.Model.compute_loss .*, which a pipeline "
        r"never runs",
    ),
    "a nested model class that overrides call": (
        ValueError,
        r"OwnCall 'own_call' overrides keras.Model.call .*, which a pipeline never runs",
    ),
    "a sparse input (tf.SparseTensor)": (
        ValueError,
        r"received a tf.SparseTensor for input 'x'; expected dense tensors",
    ),
    "outputs' losses reduced differently": (
        ValueError,
        r"compiled losses reduce the batch differently \(.*'sum'.*'sum_over_batch_size'.*\); "
        r"expected one reduction",
    ),
    # Keras then trains on the per-example losses' sum and reports their mean.
    "a loss with reduction=None": (
        ValueError,
        r"a compiled loss with reduction=None: .* expected reduction='sum' for the same "
        r"gradients",
    ),
    "a batch norm called on two stages": (
        ValueError,
        r"BatchNormalization 'shared_norm' updates its state 'shared_norm/moving_\w+' on "
        r"stages 0 and 1; .* expected num_micro_batches=1",
    ),
    "a stateful RNN": (
        ValueError,
        r"GRU 'gru' is stateful: .* expected stateful=False",
    ),
}
