"""A Keras user's whole cycle with a pipelined model (lingpipe.keras.model_base):
fit twice and after a fit that raised, BackupAndRestore, seeds, any batch size, nested
outputs with per-output losses, summary(), save/load/export/serve in fresh processes."""

import os
import re
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import lingpipe.keras as lpk
from lingpipe import test_utils

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEVICES = ["/device:CPU:1", "/device:CPU:2"]


def _Layers():
    return [keras.layers.Dense(16, activation="relu"), keras.layers.Dense(10)]


def _Compile(model, **kwargs):
    model.compile(
        optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        **kwargs,
    )
    return model


def _Pair(num_micro_batches=4, **kwargs):
    """A pipelined model and the plain keras.Sequential of the same layers and weights."""
    model = lpk.PipelinedSequential(
        _Layers(),
        num_stages=2,
        num_micro_batches=num_micro_batches,
        input_shape=(8,),
        devices=DEVICES,
        **kwargs,
    )
    ref = keras.Sequential([keras.Input((8,))] + _Layers())
    ref.set_weights(model.get_weights())
    return _Compile(model), _Compile(ref)


def _Digits(n):
    rng = np.random.RandomState(0)
    return rng.randn(n, 8).astype(np.float32), rng.randint(0, 10, n)


def _AssertSameHistory(history, ref_history):
    assert history.history.keys() == ref_history.history.keys()
    for key, values in ref_history.history.items():
        np.testing.assert_allclose(history.history[key], values, rtol=1e-5, atol=1e-6, err_msg=key)


def test_any_batch_size_fit_evaluate_predict_equal_the_plain_model():
    """1,797 examples in batches of 64: the last has 5 rows, split 2, 1, 1, 1."""
    model, ref = _Pair()
    x, y = _Digits(1797)
    xv, yv = _Digits(100)
    fit = dict(batch_size=64, epochs=1, shuffle=False, verbose=0)
    _AssertSameHistory(
        model.fit(x, y, validation_split=0.1, **fit), ref.fit(x, y, validation_split=0.1, **fit)
    )
    _AssertSameHistory(
        model.fit(x, y, validation_data=(xv, yv), **fit),
        ref.fit(x, y, validation_data=(xv, yv), **fit),
    )
    test_utils.AssertAllClose(model.get_weights(), ref.get_weights(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        model.evaluate(x, y, batch_size=64, verbose=0),
        ref.evaluate(x, y, batch_size=64, verbose=0),
        rtol=1e-5,
    )
    np.testing.assert_allclose(
        model.predict(x, batch_size=64, verbose=0),
        ref.predict(x, batch_size=64, verbose=0),
        atol=1e-5,
    )


def test_a_batch_smaller_than_the_micro_batches_says_so_in_one_line():
    model, _ = _Pair()
    x, y = _Digits(7)
    # Batches of 3, 3 and 1 rows for M=4: fit's are known from the arrays before it starts.
    with pytest.raises(ValueError) as raised:
        model.fit(x, y, batch_size=3, verbose=0)
    message = str(raised.value)
    assert "\n" not in message and "\\" not in message, message
    assert re.search(r"PipelinedSequential '\w+': fit's batches would hold 3 rows", message)
    assert "num_micro_batches=4" in message, message
    # predict takes any batch: the small ones are padded to M rows and cut back.
    np.testing.assert_allclose(
        model.predict(x, batch_size=3, verbose=0), model.predict(x, batch_size=7, verbose=0)
    )


def test_fit_twice_and_after_a_fit_that_raised():
    model, ref = _Pair()
    x, y = _Digits(64)
    with pytest.raises(ValueError, match=r"target.shape=\(4, 2\)"):
        model.fit(x, np.stack([y, y], 1), batch_size=16, verbose=0)  # the trace fails
    fit = dict(batch_size=16, epochs=2, shuffle=False, verbose=0)
    for _ in range(2):
        _AssertSameHistory(model.fit(x, y, **fit), ref.fit(x, y, **fit))
    test_utils.AssertAllClose(model.get_weights(), ref.get_weights(), rtol=1e-5, atol=1e-6)


def test_the_pipeline_of_a_compiled_model_is_compiled_the_same_way():
    # keras_hub's tasks compile themselves as they are made, and their users call fit
    # at once. The pipeline starts compiled as its model was, with an optimizer of its
    # own (fresh slots), and without XLA, which cannot span the stages.
    def Make():
        keras.utils.set_random_seed(5)
        inputs = keras.Input((8,))
        hidden = keras.layers.Dense(16, activation="relu")(inputs)
        return keras.Model(inputs, keras.layers.Dense(10)(hidden))

    model, ref = _Compile(Make(), jit_compile=True), _Compile(Make())
    pipe = lpk.Pipeline(model, num_stages=2, num_micro_batches=4, devices=DEVICES)
    assert pipe.compiled and pipe.optimizer is not model.optimizer
    assert pipe.optimizer.get_config() == model.optimizer.get_config()
    x, y = _Digits(64)
    fit = dict(batch_size=16, epochs=2, shuffle=False, verbose=0)
    _AssertSameHistory(pipe.fit(x, y, **fit), ref.fit(x, y, **fit))
    test_utils.AssertAllClose(pipe.get_weights(), ref.get_weights(), rtol=1e-5, atol=1e-6)
    assert not lpk.Pipeline(Make(), num_stages=2, devices=DEVICES).compiled
    # What compile takes need not be serializable: a Python loss function and an
    # unregistered metric class are taken as given (the metric a fresh copy).
    model, ref = Make(), Make()
    for m in (model, ref):
        m.compile(optimizer="adam", loss=_CrossEntropy, metrics=[_Accuracy()])
    pipe = lpk.Pipeline(model, num_stages=2, num_micro_batches=4, devices=DEVICES)
    assert pipe.metrics[-1] is not model.metrics[-1]
    _AssertSameHistory(pipe.fit(x, y, **fit), ref.fit(x, y, **fit))
    # An optimizer that cannot be copied (its unregistered schedule): one warning line,
    # and the pipeline is the user's to compile.
    model = Make()
    model.compile(optimizer=keras.optimizers.SGD(_Halving()), loss=_CrossEntropy)
    said = r"^lingpipe.keras.Pipeline '\w+': the model given was compiled, and its "
    said += r"optimizer or metrics could not be copied \(NotImplementedError: .*\); compile"
    with pytest.warns(UserWarning, match=said):
        pipe = lpk.Pipeline(model, num_stages=2, devices=DEVICES)
    assert not pipe.compiled


def _CrossEntropy(y, logits):
    return keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)


class _Accuracy(keras.metrics.SparseCategoricalAccuracy):
    pass


class _Halving(keras.optimizers.schedules.LearningRateSchedule):
    def __call__(self, step):
        return 0.1 * 0.5 ** keras.ops.cast(step, "float32")


class _StopAtEpoch(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise RuntimeError(f"interrupted at epoch {epoch}")


def test_backup_and_restore_resumes_an_interrupted_fit(tmp_path):
    model, _ = _Pair()
    uninterrupted, _ = _Pair()
    uninterrupted.set_weights(model.get_weights())
    x, y = _Digits(64)
    fit = dict(batch_size=16, epochs=3, shuffle=False, verbose=0)
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    with pytest.raises(RuntimeError, match="interrupted at epoch 2"):
        model.fit(x, y, callbacks=[backup, _StopAtEpoch(2)], **fit)
    resumed = model.fit(x, y, callbacks=[backup], **fit)
    assert resumed.epoch == [2]  # epochs 0 and 1 were restored, not run again
    full = uninterrupted.fit(x, y, **fit)
    np.testing.assert_allclose(resumed.history["loss"], full.history["loss"][2:], rtol=1e-5)
    test_utils.AssertAllClose(model.get_weights(), uninterrupted.get_weights(), rtol=1e-5)
    for slot, w in zip(model.optimizer.momentums, model.trainable_weights):
        assert slot.value.device == w.value.device, (slot.path, w.path)


@keras.saving.register_keras_serializable(package="lingpipe_test")
class TwoHeads(keras.layers.Layer):
    """Two outputs from one input: {'a': x @ wa [batch, 3], 'b': x @ wb [batch, 2]}."""

    def build(self, input_shape):
        self.wa = self.add_weight(shape=(input_shape[-1], 3), name="wa")
        self.wb = self.add_weight(shape=(input_shape[-1], 2), name="wb")

    def call(self, inputs):
        return {"a": inputs @ self.wa, "b": inputs @ self.wb}

    def compute_output_shape(self, input_shape):
        return {"a": (*input_shape[:-1], 3), "b": (*input_shape[:-1], 2)}


@pytest.mark.parametrize("remat", ["always", "except_last"])
def test_two_outputs_with_their_losses_weights_metrics_and_sample_weights(remat):
    """Per-output loss metrics count each micro-batch once, whichever were recomputed."""

    def Layers():
        return [keras.layers.Dense(6, activation="tanh"), TwoHeads()]

    model = lpk.PipelinedSequential(
        Layers(), num_stages=2, num_micro_batches=3, input_shape=(5,), devices=DEVICES, remat=remat
    )
    inputs = keras.Input((5,))
    outputs = inputs
    for layer in Layers():
        outputs = layer(outputs)
    ref = keras.Model(inputs, outputs)
    ref.set_weights(model.get_weights())
    for m in (model, ref):
        m.compile(
            optimizer=keras.optimizers.SGD(0.1),
            loss={"a": "mse", "b": "mae"},
            loss_weights={"a": 1.0, "b": 0.5},
            metrics={"a": ["mae"]},
        )
    rng = np.random.RandomState(0)
    x = rng.randn(30, 5).astype(np.float32)
    y = {"a": rng.randn(30, 3).astype(np.float32), "b": rng.randn(30, 2).astype(np.float32)}
    weights = rng.uniform(0.5, 2.0, 30).astype(np.float32)
    fit = dict(sample_weight=weights, batch_size=12, epochs=2, shuffle=False, verbose=0)
    history, ref_history = model.fit(x, y, **fit), ref.fit(x, y, **fit)
    assert {"a_loss", "b_loss", "a_mae"} <= set(history.history), history.history.keys()
    _AssertSameHistory(history, ref_history)
    test_utils.AssertAllClose(model.get_weights(), ref.get_weights(), rtol=1e-5, atol=1e-6)
    predicted, expected = model.predict(x, verbose=0), ref.predict(x, verbose=0)
    for key in ("a", "b"):
        np.testing.assert_allclose(predicted[key], expected[key], atol=1e-5)


def test_summary_shows_each_stage_with_its_device_layers_and_params():
    model = lpk.PipelinedSequential(
        [keras.layers.Dense(4, name="first"), keras.layers.Dense(3, name="second")],
        num_stages=2,
        input_shape=(5,),
        devices=DEVICES,
    )
    lines = []
    model.summary(print_fn=lambda line, *args, **kwargs: lines.append(line))
    table = lines[-1].splitlines()
    assert table[1].split() == ["stage", "device", "params", "layers"]
    assert table[2].split() == ["0", "/device:CPU:1", "24", "first"]  # 5 x 4 + 4
    assert table[3].split() == ["1", "/device:CPU:2", "15", "second"]  # 4 x 3 + 3


def test_a_schedule_value_is_saved_in_the_keras_file(tmp_path):
    from lingpipe.pipeline.schedules import generators

    value = generators.Make("zbv", 2, 4)
    model = lpk.PipelinedSequential(
        [keras.layers.Dense(4, name=n) for n in "abcd"],
        num_stages=2,
        num_micro_batches=4,
        schedule=value,
        input_shape=(4,),
        devices=DEVICES,
    )
    model.save(str(tmp_path / "m.keras"))
    loaded = keras.models.load_model(str(tmp_path / "m.keras"))
    sched = loaded.pipeline.Schedule()
    assert (sched.name, sched.device_actions) == ("zbv", value.device_actions)


def test_summary_shows_the_v_placement_of_a_v_shaped_schedule():
    names = ["a", "b", "c", "d"]
    model = lpk.PipelinedSequential(
        [keras.layers.Dense(4, name=n) for n in names],
        num_stages=2,
        num_micro_batches=4,
        schedule="zbv",
        input_shape=(4,),
        devices=DEVICES,
    )
    table = model.StagesTable().splitlines()[2:]
    # Stages 0..3 on devices 0, 1, 1, 0: the first device holds both ends of the model.
    assert [row.split()[:2] for row in table] == [
        ["0", DEVICES[0]],
        ["1", DEVICES[1]],
        ["2", DEVICES[1]],
        ["3", DEVICES[0]],
    ]


# Each script runs in a fresh process: devices and imports are the process' own.
_SERVE = """
    import sys
    import numpy as np
    import tensorflow as tf
    x = np.load(sys.argv[1] + "/x.npy")
    exported = tf.saved_model.load(sys.argv[1] + "/exported")
    saved = tf.saved_model.load(sys.argv[1] + "/saved_model")
    outputs = [exported.serve(x), saved.signatures["serving_default"](tf.constant(x))]
    outputs[1] = list(outputs[1].values())[0]
    np.save(sys.argv[1] + "/served.npy", np.stack([o.numpy() for o in outputs]))
    assert not [name for name in sys.modules if name.startswith("lingpipe")]
    # TensorFlow has started with one CPU device: too late to make two.
    import keras, lingpipe.keras
    try:
        keras.models.load_model(sys.argv[1] + "/model.keras")
    except RuntimeError as e:
        print("REFUSED:", e)
"""

_LOAD = """
    import sys
    import keras
    import numpy as np
    import lingpipe.keras  # registers PipelinedSequential and Pipeline
    # The Functional Pipeline first: its inner model must not start TensorFlow before
    # the 2 logical devices are made.
    pipe = keras.models.load_model(sys.argv[1] + "/pipeline.keras")
    x = np.load(sys.argv[1] + "/x.npy")
    np.save(sys.argv[1] + "/loaded_pipeline.npy", pipe.predict(x, verbose=0))
    model = keras.models.load_model(sys.argv[1] + "/model.keras")
    np.save(sys.argv[1] + "/loaded.npy", model.predict(np.load(sys.argv[1] + "/x.npy"), verbose=0))
    print("DEVICES:", model.pipeline.devices)
"""


def _RunScript(script, directory):
    path = os.environ.get("PYTHONPATH")
    env = dict(os.environ, PYTHONPATH=ROOT + (os.pathsep + path if path else ""))
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), str(directory)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow  # two fresh processes: 6 s on an idle machine, 28 s on a busy one
def test_save_load_export_and_serve_in_fresh_processes(tmp_path):
    model = lpk.PipelinedSequential(_Layers(), num_stages=2, num_micro_batches=2, input_shape=(8,))
    _Compile(model)
    x, y = _Digits(32)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    x = x[:6]
    np.save(tmp_path / "x.npy", x)
    expected = model.predict(x, verbose=0)
    model.save(str(tmp_path / "model.keras"))
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(6, activation="relu")(inputs)
    base = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Add()([hidden, hidden])))
    pipe = lpk.Pipeline(base, num_stages=2, num_micro_batches=2)
    expected_pipeline = pipe.predict(x, verbose=0)
    pipe.save(str(tmp_path / "pipeline.keras"))
    model.export(str(tmp_path / "exported"), verbose=False)
    tf.saved_model.save(model, str(tmp_path / "saved_model"))

    out = _RunScript(_SERVE, tmp_path)
    served = np.load(tmp_path / "served.npy")
    np.testing.assert_allclose(served[0], expected, atol=1e-6)
    np.testing.assert_allclose(served[1], expected, atol=1e-6)
    refused = [line for line in out.splitlines() if line.startswith("REFUSED:")]
    assert len(refused) == 1, out
    assert "call lingpipe.cluster.SetLogicalCpuDevices(2) at the top" in refused[0], refused
    assert "started with 1 CPU device(s)" in refused[0], refused

    out = _RunScript(_LOAD, tmp_path)  # a fresh process makes the 2 devices it needs
    assert "DEVICES: ['/device:CPU:0', '/device:CPU:1']" in out, out
    np.testing.assert_allclose(np.load(tmp_path / "loaded.npy"), expected, atol=1e-6)
    loaded = np.load(tmp_path / "loaded_pipeline.npy")
    np.testing.assert_allclose(loaded, expected_pipeline, atol=1e-6)


def test_saved_model_signature_of_dict_inputs_is_named_after_their_keys(tmp_path):
    ids = keras.Input((6,), dtype="int32", name="ids")
    mask = keras.Input((6,), name="mask")
    h = keras.layers.Embedding(20, 4)(ids) * mask[..., None]
    h = keras.layers.GlobalAveragePooling1D()(keras.layers.Dense(4, activation="relu")(h))
    base = keras.Model({"ids": ids, "mask": mask}, keras.layers.Dense(3)(h))
    model = lpk.Pipeline(base, num_stages=2, num_micro_batches=2, devices=DEVICES)
    rng = np.random.RandomState(0)
    x = {"ids": rng.randint(0, 20, (5, 6)).astype(np.int32), "mask": np.ones((5, 6), np.float32)}
    expected = model.predict(x, verbose=0)
    tf.saved_model.save(model, str(tmp_path / "saved"))
    serving = tf.saved_model.load(str(tmp_path / "saved")).signatures["serving_default"]
    _, inputs = serving.structured_input_signature
    assert {k: (s.dtype, tuple(s.shape)) for k, s in inputs.items()} == {
        "ids": (tf.int32, (None, 6)),
        "mask": (tf.float32, (None, 6)),
    }
    served = serving(**{k: tf.constant(v) for k, v in x.items()})
    np.testing.assert_allclose(list(served.values())[0].numpy(), expected, atol=1e-6)


@pytest.mark.parametrize("front", ["Pipeline", "PipelinedSequential"])
def test_every_slot_of_an_optimizer_that_makes_its_own_sits_beside_its_weight(front):
    # Adafactor makes its factored moments with add_variable, which names no weight,
    # and placeholders for weights of rank < 2 (the plain Keras optimizer's).
    if front == "Pipeline":
        plain = keras.Sequential([keras.Input((8,))] + _Layers())
        model = lpk.Pipeline(plain, num_stages=2, num_micro_batches=2, devices=DEVICES)
    else:
        model = _Pair(num_micro_batches=2)[0]
    model.compile(optimizer=keras.optimizers.Adafactor(0.01), loss="mse")
    opt = model.optimizer
    assert len(opt._r) == len(opt._c) == len(opt._v) == len(model.trainable_weights)  # noqa: SLF001
    for w, r, c, v in zip(model.trainable_weights, opt._r, opt._c, opt._v):  # noqa: SLF001
        assert {s.value.device for s in (r, c, v)} == {w.value.device}, w.path


def _SeededDropoutFit(front, seed, dropout_seed=None):
    """fit's losses of a dropout net built after keras.utils.set_random_seed(seed), its
    layers named by Keras' counters (each build names them anew), through `front`."""
    keras.utils.set_random_seed(seed)
    tenth = keras.initializers.Constant(0.1)
    layers = [
        keras.layers.Dense(16, activation="relu", kernel_initializer=tenth),
        keras.layers.Dropout(0.5, seed=dropout_seed),
        keras.layers.Dense(3, kernel_initializer=tenth),
    ]
    knobs = dict(num_stages=2, num_micro_batches=2, devices=DEVICES)
    if front == "Pipeline":
        x = keras.Input((8,))
        model = lpk.Pipeline(keras.Model(x, keras.Sequential(layers)(x)), **knobs)
    else:
        model = lpk.PipelinedSequential(layers, input_shape=(8,), **knobs)
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    x, y = np.random.RandomState(0).rand(32, 8), np.random.RandomState(1).rand(32, 3)
    return model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0).history["loss"]


@pytest.mark.parametrize("front", ["Pipeline", "PipelinedSequential"])
def test_keras_s_random_seed_sets_the_dropout_masks_as_it_does_for_the_plain_model(front):
    # As in Keras: a seed generator without a seed of its own draws one from the seed
    # keras.utils.set_random_seed gave, and one with a seed of its own keeps it.
    first, again = _SeededDropoutFit(front, 5), _SeededDropoutFit(front, 5)
    assert first == again
    assert _SeededDropoutFit(front, 6) != first
    assert _SeededDropoutFit(front, 5, dropout_seed=9) == _SeededDropoutFit(front, 6, 9)


def test_a_model_compiled_without_a_loss_whose_layers_add_none_says_so_in_one_line():
    # The plain model says "No loss to compute" too; with a layer's add_loss both train
    # (the conformance table's row "compiled without a loss: the layers' losses alone").
    x = keras.Input((8,))
    model = lpk.Pipeline(
        keras.Model(x, keras.layers.Dense(3)(keras.layers.Dense(4)(x))),
        num_stages=2,
        num_micro_batches=2,
        devices=DEVICES,
    )
    model.compile(optimizer="sgd")
    with pytest.raises(ValueError) as raised:
        model.fit(np.ones((4, 8)), np.ones((4, 3)), batch_size=4, verbose=0)
    (line,) = str(raised.value).splitlines()
    assert "no loss to compute: compile() was given no loss and no layer adds one" in line
