"""lingpipe.keras.Pipeline: dropout under recomputation, Keras masks across a cut, schedules
of two stages per device, one remat policy per stage, and its config (save and load in this
process)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import lingpipe.keras as lpk
from lingpipe import test_utils
from lingpipe.pipeline.step import remat as remat_lib

DEVICES = ["/device:CPU:1", "/device:CPU:2"]


def _DropoutNet():
    keras.utils.set_random_seed(2)
    x = keras.Input((6,))
    h = keras.layers.Dense(16, activation="relu", name="d1")(x)
    h = keras.layers.Dropout(0.5, name="drop1")(h)
    h = keras.layers.Dense(16, activation="relu", name="d2")(h)
    h = keras.layers.Dropout(0.5, name="drop2")(h)
    return keras.Model(x, keras.layers.Dense(1, name="out")(h))


def _Data(n=16, dims=6):
    rng = np.random.RandomState(0)
    return rng.randn(n, dims).astype(np.float32), rng.randn(n, 1).astype(np.float32)


def _FitWeights(model, remat, x, y):
    pipe = lpk.Pipeline(
        model, num_stages=2, num_micro_batches=4, split_points=["d2"], remat=remat, devices=DEVICES
    )
    pipe.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    history = pipe.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    return [w.numpy() for w in model.weights], history.history["loss"]


def test_dropout_masks_are_reproduced_by_recomputation():
    """remat='always' replays each forward in backward: with the same stateless seeds its
    masks are the forward's, so the step equals remat='never' (which keeps the forward)."""
    x, y = _Data()
    never, loss_never = _FitWeights(_DropoutNet(), "never", x, y)
    always, loss_always = _FitWeights(_DropoutNet(), "always", x, y)
    for a, b in zip(never, always):
        np.testing.assert_allclose(a, b, atol=1e-6)
    np.testing.assert_allclose(loss_never, loss_always, rtol=1e-6)
    # Dropout was on: the same model without it (inference) has another loss.
    plain = _DropoutNet()
    plain.compile(loss="mse")
    assert abs(plain.evaluate(x[:8], y[:8], verbose=0) - loss_never[0]) > 1e-3


def test_keras_mask_crosses_a_cut():
    """Embedding(mask_zero=True) on stage 0; the masked average pooling on stage 1."""
    keras.utils.set_random_seed(3)
    ids = keras.Input((5,), dtype="int32")
    h = keras.layers.Embedding(9, 4, mask_zero=True, name="embed")(ids)
    h = keras.layers.Dense(4, name="proj")(h)
    h = keras.layers.GlobalAveragePooling1D(name="pool")(h)
    model = keras.Model(ids, keras.layers.Dense(2, name="out")(h))
    plain = keras.models.clone_model(model)
    plain.set_weights(model.get_weights())
    x = np.random.RandomState(0).randint(0, 9, (8, 5)).astype(np.int32)
    x[:, 3:] = 0  # padding
    pipe = lpk.Pipeline(
        model, num_stages=2, num_micro_batches=2, split_points=["pool"], devices=DEVICES
    )
    np.testing.assert_allclose(pipe.predict(x, verbose=0), plain.predict(x, verbose=0), atol=1e-6)


def test_a_layer_that_clears_its_inputs_masks_trains_as_the_plain_model():
    """Keras' MultiHeadAttention deletes the masks of the tensors it is called on. Its
    input crosses the cut, so the pipeline's stage reads the same tensor when it
    replays the forward for the backward: that replay must see the mask that the
    forward saw, or its gradient is taken through unmasked attention and pooling."""
    keras.utils.set_random_seed(5)
    ids = keras.Input((10,), dtype="int32")
    h = keras.layers.Embedding(50, 16, mask_zero=True, name="embed")(ids)
    h = keras.layers.Dense(16, name="proj")(h)
    a = keras.layers.MultiHeadAttention(2, 8, name="mha")(h, h, use_causal_mask=True)
    h = keras.layers.LayerNormalization(name="norm")(h + a)
    h = keras.layers.GlobalAveragePooling1D(name="pool")(h)
    model = keras.Model(ids, keras.layers.Dense(3, name="out")(h))
    plain = keras.models.clone_model(model)
    plain.set_weights(model.get_weights())
    rng = np.random.RandomState(0)
    x, y = rng.randint(1, 50, (16, 10)), rng.randint(0, 3, 16)
    for row in x:
        row[rng.randint(3, 10) :] = 0  # padding of each row's own length
    pipe = lpk.Pipeline(
        model, num_stages=2, num_micro_batches=2, split_points=["mha"], remat="always",
        devices=DEVICES,
    )  # fmt: skip
    for m in (pipe, plain):
        m.compile(optimizer=keras.optimizers.SGD(0.1), loss=_SparseCe())
    ours = pipe.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history["loss"]
    theirs = plain.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history["loss"]
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    for w, a_, b in zip(plain.weights, pipe.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(a_, b, atol=1e-5, err_msg=w.path)


def _SparseCe():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _FineTuned(wrap):
    """keras.io's transfer-learning recipe: the base frozen, the head fitted; then the base
    unfrozen, compiled again at a lower rate and fitted -> (losses, weights)."""
    keras.utils.set_random_seed(5)
    base = keras.Sequential(
        [
            keras.layers.Dense(16, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(16, activation="relu"),
        ],
        name="base",
    )
    x = keras.Input((6,))
    h = keras.layers.Dense(16, activation="tanh", name="d2")(base(x))
    model = keras.Model(x, keras.layers.Dense(1, name="out")(h))
    data, labels = _Data()
    base.trainable = False
    trained = wrap(model)
    losses = []
    for rate in (0.05, 0.01):
        trained.compile(optimizer=keras.optimizers.Adam(rate), loss="mse")
        fitted = trained.fit(data, labels, batch_size=8, epochs=2, shuffle=False, verbose=0)
        losses += fitted.history["loss"]
        base.trainable = True
    return losses, [w.numpy() for w in model.weights]


def test_a_base_unfrozen_and_compiled_again_trains_as_the_plain_model():
    """The weights a step trains are those trainable when compile() is called, as Keras
    has it: the unfrozen base trains, and its batch norm left inference mode."""
    plain_losses, plain_weights = _FineTuned(lambda m: m)
    losses, weights = _FineTuned(
        lambda m: lpk.Pipeline(m, num_stages=2, num_micro_batches=1, devices=DEVICES)
    )
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-5)
    for a, b in zip(weights, plain_weights):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_two_stages_per_device_cut_the_model_into_twice_as_many_stages():
    pipe = lpk.Pipeline(
        _DropoutNet(), num_stages=2, num_micro_batches=4, schedule="zbv", devices=DEVICES
    )
    assert len(pipe.pipeline.cut.stages) == 4
    assert [pipe.pipeline.StageDevice(s) for s in range(4)] == [
        DEVICES[0],
        DEVICES[1],
        DEVICES[1],
        DEVICES[0],
    ]


def test_split_points_for_two_stages_per_device_count_the_stages_in_one_line():
    with pytest.raises(
        ValueError,
        match=r"expected 3 split point\(s\) \(num_stages=2 x 2 stages per device of schedule "
        r"'zbv' = 4 stages\)",
    ) as e:
        lpk.Pipeline(
            _DropoutNet(),
            num_stages=2,
            num_micro_batches=4,
            split_points=["d2"],
            schedule="zbv",
            devices=DEVICES,
        )
    assert "\n" not in str(e.value)


def test_more_stages_than_layer_calls_counts_the_schedule_s_stages():
    x = keras.Input((6,))
    model = keras.Model(x, keras.layers.Dense(1, name="out")(keras.layers.Dense(4)(x)))
    with pytest.raises(
        ValueError,
        match=r"num_stages=2 x 2 stages per device of schedule 'interleaved_1f1b' = 4 stages "
        r"is more than the model's 2 layer call\(s\)",
    ):
        lpk.Pipeline(
            model,
            num_stages=2,
            num_micro_batches=2,
            schedule="interleaved_1f1b",
            num_virtual_stages=2,
            devices=DEVICES,
        )


def test_config_round_trip_and_keras_file(tmp_path):
    model = _DropoutNet()
    pipe = lpk.Pipeline(
        model,
        num_stages=2,
        num_micro_batches=2,
        split_points=["drop1", "d2", "drop2"],
        schedule="interleaved_1f1b",
        num_virtual_stages=2,
        devices=DEVICES,
    )
    config = pipe.get_config()
    assert config["split_points"] == ["drop1", "d2", "drop2"] and config["num_micro_batches"] == 2
    assert config["num_virtual_stages"] == 2
    x, _ = _Data(8)
    want = pipe.predict(x, verbose=0)
    path = str(tmp_path / "pipe.keras")
    pipe.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded, lpk.Pipeline)
    assert loaded.pipeline.devices == pipe.pipeline.devices
    assert loaded.pipeline.cut.stages == pipe.pipeline.cut.stages
    np.testing.assert_allclose(loaded.predict(x, verbose=0), want, atol=1e-6)


def _TanhNet():
    keras.utils.set_random_seed(4)
    x = keras.Input((6,))
    h = x
    for i in range(3):
        h = keras.layers.Dense(8, activation="tanh", name=f"d{i}")(h)
    return keras.Model(x, keras.layers.Dense(1, name="out")(h))


def test_one_remat_policy_per_stage_fits_as_the_plain_model_and_is_saved(tmp_path):
    remat = ["always", "never", "except_last", "always"]  # zbv: 4 stages on 2 devices
    model = _TanhNet()
    plain = keras.models.clone_model(model)
    plain.set_weights(model.get_weights())
    pipe = lpk.Pipeline(
        model, num_stages=2, num_micro_batches=4, schedule="zbv", remat=remat, devices=DEVICES
    )
    sched = pipe.pipeline.Schedule(4)
    assert pipe.pipeline.KeptActivations(sched) == remat_lib.Kept(sched, remat)
    for m in (pipe, plain):
        m.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    x, y = _Data()
    fit = dict(batch_size=8, epochs=2, shuffle=False, verbose=0)
    history, plain_history = pipe.fit(x, y, **fit), plain.fit(x, y, **fit)
    np.testing.assert_allclose(history.history["loss"], plain_history.history["loss"], rtol=1e-5)
    test_utils.AssertAllClose(pipe.get_weights(), plain.get_weights(), rtol=1e-5, atol=1e-6)
    assert pipe.get_config()["remat"] == remat
    pipe.save(str(tmp_path / "pipe.keras"))
    loaded = keras.models.load_model(str(tmp_path / "pipe.keras"))
    assert loaded.get_config()["remat"] == remat
    assert loaded.pipeline.KeptActivations(sched) == remat_lib.Kept(sched, remat)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), pipe.predict(x, verbose=0), atol=1e-6)


def test_a_remat_list_of_the_wrong_length_or_policy_is_refused_in_one_line():
    for remat, stages in ((["always", "never"], 4), (("never", "sometimes"), 2)):
        schedule = "zbv" if stages == 4 else "1f1b"
        with pytest.raises(ValueError) as e:
            lpk.Pipeline(
                _TanhNet(), num_stages=2, schedule=schedule, remat=remat, devices=DEVICES, name="p"
            )
        assert str(e.value) == (
            "lingpipe.keras.Pipeline 'p': expected remat to be one of always, except_last, "
            f"never or a list of them with one per stage ({stages} stages), received "
            f"remat={remat!r}"
        )
    # A tuple is kept as the list a saved config holds.
    pipe = lpk.Pipeline(_TanhNet(), num_stages=2, remat=("never", "always"), devices=DEVICES)
    assert pipe.get_config()["remat"] == ["never", "always"]
    assert lpk.Pipeline.from_config(pipe.get_config()).get_config()["remat"] == ["never", "always"]


def _BatchNormNet():
    keras.utils.set_random_seed(8)
    x = keras.Input((6,))
    h = keras.layers.Dense(8, name="d1")(x)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.Dense(8, activation="relu", name="d2")(h)
    return keras.Model(x, keras.layers.Dense(1, name="out")(h))


@pytest.mark.parametrize("remat", ["always", "never"])
def test_custom_training_loop_under_a_tape(remat):
    """A caller's tf.GradientTape over model(x, training=True) in a tf.function: the
    gradients and moving statistics of the plain model run on the micro-batches in turn."""
    model = _BatchNormNet()
    plain = keras.models.clone_model(model)
    plain.set_weights(model.get_weights())
    pipe = lpk.Pipeline(
        model, num_stages=2, num_micro_batches=4, split_points=["d2"], remat=remat, devices=DEVICES
    )
    x, y = _Data(8)
    mse = keras.losses.MeanSquaredError()

    @tf.function
    def PipeGradients(x, y):
        with tf.GradientTape() as tape:
            loss = mse(y, pipe(x, training=True))
        return tape.gradient(loss, pipe.trainable_weights)

    got = PipeGradients(tf.constant(x), tf.constant(y))
    # The backward is the executor's: each stage's gradient ops on its device (a plain
    # tape in a tf.function would leave them unplaced, on CPU:0).
    graph = PipeGradients.get_concrete_function(tf.constant(x), tf.constant(y)).graph
    grads = [
        op
        for op in graph.get_operations()
        if op.type == "MatMul" and op.name.startswith("gradient_tape/")
    ]
    for s, device in enumerate(DEVICES):
        ops = [op for op in grads if f"_s{s}_mb" in op.name]
        assert len(ops) == 4 * 2 * (1 if s == 0 else 2), (s, [op.name for op in ops])
        assert all(op.device == device for op in ops), [(op.name, op.device) for op in ops]
    want = [tf.zeros_like(w) for w in plain.trainable_weights]
    for xm, ym in zip(np.split(x, 4), np.split(y, 4)):
        with tf.GradientTape() as tape:
            loss = mse(ym, plain(xm, training=True)) / 4
        want = [a + g for a, g in zip(want, tape.gradient(loss, plain.trainable_weights))]
    for w, g, r in zip(pipe.trainable_weights, got, want):
        np.testing.assert_allclose(g.numpy(), r.numpy(), atol=1e-5, err_msg=w.path)
    for a, b in zip(model.non_trainable_weights, plain.non_trainable_weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-6, err_msg=a.path)


def test_schedule_given_as_a_value_or_a_csv_file(tmp_path):
    """schedule= takes a Schedule value or a CSV path in torch's format, as names do."""
    from lingpipe.pipeline.schedules import generators, schedule

    x, y = _Data()

    def Fit(sched):
        pipe = lpk.Pipeline(
            _DropoutNet(), num_stages=2, num_micro_batches=4, schedule=sched, devices=DEVICES
        )
        pipe.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        pipe.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        return pipe.get_weights()

    want = Fit("1f1b")
    value = generators.Make("1f1b", 2, 4)
    path = tmp_path / "one_f_one_b.csv"
    path.write_text(schedule.ToCsv(value))
    for given in (value, str(path), path):
        for a, b in zip(Fit(given), want):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", ["value", "path"])
def test_a_pipeline_with_a_schedule_value_or_path_saves_and_loads(tmp_path, kind):
    """A .keras file holds a Schedule value as its CSV text (with its name and M)."""
    from lingpipe.pipeline.schedules import generators, schedule

    value = generators.Make("zbv", 2, 4)
    given = value
    if kind == "path":
        given = tmp_path / "zbv.csv"
        given.write_text(schedule.ToCsv(value))
    pipe = lpk.Pipeline(
        _DropoutNet(), num_stages=2, num_micro_batches=4, schedule=given, devices=DEVICES
    )
    x, _ = _Data(8)
    want = pipe.predict(x, verbose=0)
    pipe.save(str(tmp_path / "pipe.keras"))
    loaded = keras.models.load_model(str(tmp_path / "pipe.keras"))
    sched = loaded.pipeline.Schedule(4)
    assert sched.device_actions == value.device_actions
    assert sched.stage_devices == value.stage_devices
    if kind == "value":
        assert sched.name == "zbv"
    np.testing.assert_allclose(loaded.predict(x, verbose=0), want, atol=1e-6)
