"""lingpipe.keras.PipelinedSequential: a keras.Model that is a pipeline, trained by fit."""

import os

import keras
import numpy as np
import pytest

import lingpipe.keras as lpk
from lingpipe import test_utils

DEVICES = ["/device:CPU:1", "/device:CPU:2", "/device:CPU:3"]


def _Layers(dropout=0.0):
    return [
        keras.layers.Dense(8, activation="relu"),
        keras.layers.LayerNormalization(),
        keras.layers.Dropout(dropout),
        keras.layers.Dense(6, activation="tanh"),
        keras.layers.Dense(3),
    ]


def _Data():
    rng = np.random.RandomState(0)
    return rng.randn(16, 5).astype(np.float32), rng.randn(16, 3).astype(np.float32)


def _Model(num_stages, **kwargs):
    kwargs.setdefault("devices", DEVICES[:num_stages])
    model = lpk.PipelinedSequential(
        _Layers(), num_stages=num_stages, num_micro_batches=4, input_shape=(5,), **kwargs
    )
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    return model


def _Reference(model):
    """The same layers as a plain keras.Sequential, with the pipelined model's weights."""
    ref = keras.Sequential([keras.Input((5,))] + _Layers())
    ref.set_weights(model.get_weights())
    ref.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    return ref


def _StageDevice(variable):
    return variable.value.device[-5:]


@pytest.mark.parametrize(
    "num_stages,schedule,remat",
    [
        (2, "gpipe", "always"),
        (3, "1f1b", "always"),
        (3, "1f1b", ["never", "except_last", "always"]),
    ],
)
def test_fit_gives_the_weights_of_the_plain_keras_model(num_stages, schedule, remat):
    model = _Model(num_stages, schedule=schedule, remat=remat)
    ref = _Reference(model)
    x, y = _Data()
    history = model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    ref_history = ref.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    test_utils.AssertAllClose(model.get_weights(), ref.get_weights(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(history.history["loss"], ref_history.history["loss"], rtol=1e-5)
    # Every layer's weights, and the optimizer's momentum of each, on its stage's device.
    stages = model.pipeline.stage_cells
    for k, cells in enumerate(stages):
        for i in cells:
            for w in model.pipeline_layers[i].weights:
                assert _StageDevice(w) == DEVICES[k][-5:], (w.path, k)
    momentums = model.optimizer.momentums  # one per trainable weight, in the same order
    assert len(momentums) == len(model.trainable_weights)
    for slot, w in zip(momentums, model.trainable_weights):
        assert _StageDevice(slot) == _StageDevice(w), (slot.path, w.path)
    np.testing.assert_allclose(model.predict(x, verbose=0), ref.predict(x, verbose=0), atol=1e-5)


def test_callbacks_checkpoint_tensorboard_early_stopping(tmp_path):
    model = _Model(2)
    x, y = _Data()
    path = str(tmp_path / "model.weights.h5")
    callbacks = [
        keras.callbacks.ModelCheckpoint(path, save_weights_only=True),
        keras.callbacks.TensorBoard(str(tmp_path / "tb")),
        # Stops once the loss fails to rise: after the second epoch.
        keras.callbacks.EarlyStopping(monitor="loss", mode="max", patience=0),
    ]
    history = model.fit(x, y, batch_size=8, epochs=5, verbose=0, callbacks=callbacks)
    losses = history.history["loss"]
    assert len(losses) == 2 and losses[1] < losses[0], losses
    assert os.listdir(tmp_path / "tb" / "train")
    fresh = _Model(2)
    assert not np.allclose(fresh.get_weights()[0], model.get_weights()[0])
    fresh.load_weights(path)
    test_utils.AssertAllClose(fresh.get_weights(), model.get_weights(), rtol=0, atol=0)
    for w in fresh.weights:  # restored in place: still on their stages
        assert w.value.device[-5:] in ("CPU:1", "CPU:2")
    loss = model.evaluate(x, y, batch_size=8, verbose=0)
    assert loss == pytest.approx(fresh.evaluate(x, y, batch_size=8, verbose=0), rel=1e-6)
    # A whole-model .keras file: config, weights and the compiled optimizer's state.
    model.save(str(tmp_path / "model.keras"))
    loaded = keras.models.load_model(str(tmp_path / "model.keras"))
    assert isinstance(loaded, lpk.PipelinedSequential)
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
    for slot, w in zip(loaded.optimizer.momentums, loaded.trainable_weights):
        assert _StageDevice(slot) == _StageDevice(w) and slot.numpy().any(), slot.path


def test_eval_drops_nothing_and_training_drops_with_stateless_seeds():
    model = lpk.PipelinedSequential(
        _Layers(dropout=0.5), num_stages=2, num_micro_batches=2, input_shape=(5,)
    )
    ref = keras.Sequential([keras.Input((5,))] + _Layers(dropout=0.5))
    ref.set_weights(model.get_weights())
    x, _ = _Data()
    np.testing.assert_allclose(model.predict(x, verbose=0), ref.predict(x, verbose=0), atol=1e-5)
    train = model(x, training=True).numpy()
    assert not np.allclose(train, model(x, training=False).numpy())
    np.testing.assert_array_equal(train, model(x, training=True).numpy())


def test_errors_say_what_was_received():
    with pytest.raises(TypeError, match=r"expected Keras 3 layers .* received str at \[1\]"):
        lpk.PipelinedSequential([keras.layers.Dense(2), "relu"], num_stages=1, input_shape=(4,))
    model = lpk.PipelinedSequential(_Layers(), num_stages=2)
    model.compile(optimizer="sgd", loss="mse")
    x, y = _Data()
    with pytest.raises(ValueError, match=r"input_shape=\(5,\).*or call the model on a batch"):
        model.fit(x, y, verbose=0)


def test_one_remat_policy_per_stage_is_checked_and_saved_in_the_config():
    model = _Model(2, remat=("never", "always"))
    config = model.get_config()
    assert config["remat"] == ["never", "always"]  # as JSON holds it
    loaded = lpk.PipelinedSequential.from_config(config)
    assert loaded.get_config()["remat"] == ["never", "always"]
    assert loaded.pipeline.KeptActivations(loaded.pipeline.Schedule(4)) == {
        (0, m) for m in range(4)
    }
    with pytest.raises(ValueError) as e:
        _Model(2, schedule="zbv", remat=["always", "never"])
    assert str(e.value) == (
        "pipeline: expected remat to be one of always, except_last, never or a list of them "
        "with one per stage (4 stages), received remat=['always', 'never']"
    )


def _InputSequential(kind):
    if kind == "conv":  # the form README's Keras section shows
        return [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(2, 5, strides=3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(4),
        ]
    return [keras.Input((5,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)]


@pytest.mark.parametrize("kind", ["conv", "mlp"])
def test_a_keras_sequential_that_starts_with_keras_input_trains(kind):
    model = lpk.PipelinedSequential(
        keras.Sequential(_InputSequential(kind)), num_stages=2, num_micro_batches=2
    )
    ref = keras.Sequential(_InputSequential(kind))
    ref.set_weights(model.get_weights())
    rng = np.random.RandomState(0)
    shape = (28, 28, 1) if kind == "conv" else (5,)
    x = rng.randn(8, *shape).astype(np.float32)
    y = rng.randn(8, 4 if kind == "conv" else 3).astype(np.float32)
    for m in (model, ref):
        m.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        m.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    test_utils.AssertAllClose(model.get_weights(), ref.get_weights(), rtol=1e-5, atol=1e-6)


@keras.saving.register_keras_serializable(package="lingpipe_test")
class ScaleFeatures(keras.layers.Layer):
    """A custom subclassed layer: y = x * scale (a trained weight per feature)."""

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="scale")

    def call(self, inputs):
        return inputs * self.scale


def test_a_registered_custom_layer_trains():
    def Layers():
        return [keras.layers.Dense(4, activation="tanh"), ScaleFeatures(), keras.layers.Dense(3)]

    model = lpk.PipelinedSequential(
        Layers(), num_stages=2, num_micro_batches=2, input_shape=(5,), devices=DEVICES[:2]
    )
    assert isinstance(model.pipeline_layers[1], ScaleFeatures)
    ref = keras.Sequential([keras.Input((5,))] + Layers())
    ref.set_weights(model.get_weights())
    x, y = _Data()
    for m in (model, ref):
        m.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
        m.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    test_utils.AssertAllClose(model.get_weights(), ref.get_weights(), rtol=1e-5, atol=1e-6)
    assert not np.allclose(model.pipeline_layers[1].scale.numpy(), 1.0)  # it did train


class Unregistered(keras.layers.Layer):
    """A custom layer nobody registered with Keras."""

    def call(self, inputs):
        return inputs


@keras.saving.register_keras_serializable(package="lingpipe_test")
class TakesTable(keras.layers.Layer):
    """Registered, but made with an argument Keras cannot serialize."""

    def __init__(self, table=None, **kwargs):
        super().__init__(**kwargs)
        self.table = table

    def call(self, inputs):
        return inputs


@keras.saving.register_keras_serializable(package="lingpipe_test")
class NeedsUnits(keras.layers.Layer):
    """Registered, but its get_config leaves out an argument of __init__."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def get_config(self):
        return {"name": self.name}

    def call(self, inputs):
        return inputs


REBUILD = "(each stage builds its layers from their configs)"


@pytest.mark.parametrize(
    "layer, message",
    [
        (
            lambda: keras.layers.Lambda(lambda x: 2 * x, name="double"),
            "layers[1] is a Lambda layer ('double') of Python code, which Keras' safe mode "
            f"refuses to rebuild from its config {REBUILD}; write a small custom layer "
            "instead, decorated with @keras.saving.register_keras_serializable()",
        ),
        (
            lambda: Unregistered(name="mine"),
            "layers[1] (Unregistered 'mine') is of a class Keras cannot find by name, so no "
            f"stage can rebuild it from its config {REBUILD}; decorate Unregistered with "
            "@keras.saving.register_keras_serializable()",
        ),
        (
            lambda: TakesTable(table=object(), name="table"),
            "layers[1] (TakesTable 'table') cannot be serialized: it was made with __init__ "
            f"arguments Keras cannot serialize {REBUILD}; give TakesTable a get_config() that "
            "returns them as plain values",
        ),
        (
            lambda: NeedsUnits(3, name="units"),
            "layers[1] (NeedsUnits 'units') cannot be rebuilt from its config "
            f"{REBUILD}: NeedsUnits.__init__() missing 1 required positional argument: "
            "'units'; make NeedsUnits.get_config() return every argument of __init__",
        ),
    ],
    ids=["lambda", "unregistered", "not_serializable", "incomplete_config"],
)
def test_a_layer_keras_cannot_rebuild_is_refused_by_the_constructor(layer, message):
    # Without input_shape nothing is built before fit: the refusal must not wait for it.
    with pytest.raises(ValueError) as refused:
        lpk.PipelinedSequential([keras.layers.Dense(4), layer()], num_stages=2, name="pipe")
    assert str(refused.value) == f"PipelinedSequential 'pipe': {message}"


def test_a_lambda_of_a_keras_function_is_rebuilt_and_runs():
    # Keras serializes keras.activations.relu by name, and safe mode rebuilds it.
    layers = [keras.layers.Dense(4), keras.layers.Lambda(keras.activations.relu)]
    model = lpk.PipelinedSequential(layers, num_stages=2, input_shape=(5,), devices=DEVICES[:2])
    assert model.predict(_Data()[0], verbose=0).min() >= 0.0
