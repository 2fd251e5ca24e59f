"""lingpipe.keras.Pipeline of a Functional model with two inputs (ids and a padding mask), a
skip connection across the cut, an embedding tied to the output projection on the other
stage, and two outputs with two losses: fit equals the plain model's."""

import keras
import numpy as np
import pytest

import lingpipe.keras as lpk

DEVICES = ["/device:CPU:1", "/device:CPU:2"]
VOCAB, TIME, DIMS = 11, 5, 8


@keras.saving.register_keras_serializable(package="lingpipe_tests")
class TiedOutput(keras.layers.Layer):
    """[batch, time, dims] -> logits [batch, time, vocab] with the embedding's matrix."""

    def __init__(self, embedding: keras.layers.Embedding, **kwargs):
        super().__init__(**kwargs)
        self.embedding = embedding

    def call(self, x):
        return keras.ops.matmul(x, keras.ops.transpose(self.embedding.embeddings))


def _Model():
    ids = keras.Input((TIME,), dtype="int32", name="ids")
    mask = keras.Input((TIME,), dtype="float32", name="mask")
    embed = keras.layers.Embedding(VOCAB, DIMS, name="embed")
    h0 = embed(ids)
    h = keras.layers.Dense(DIMS, activation="relu", name="ff1")(h0)
    h = keras.layers.Dense(DIMS, name="ff2")(h)
    h = keras.layers.Add(name="skip")([h0, h])  # h0 crosses the cut before ff2
    h = keras.layers.Multiply(name="padding")([h, keras.ops.expand_dims(mask, -1)])
    lm = TiedOutput(embed, name="lm")(h)
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(h)
    cls = keras.layers.Dense(2, name="cls")(pooled)
    return keras.Model({"ids": ids, "mask": mask}, {"lm": lm, "cls": cls}, name="tied_lm")


def _Data(n=16):
    rng = np.random.RandomState(0)
    mask = (rng.rand(n, TIME) > 0.3).astype(np.float32)
    x = {"ids": rng.randint(0, VOCAB, (n, TIME)).astype(np.int32), "mask": mask}
    y = {"lm": rng.randint(0, VOCAB, (n, TIME)), "cls": rng.randint(0, 2, n)}
    return x, y


def _Compile(model):
    model.compile(
        optimizer=keras.optimizers.SGD(0.2, momentum=0.9),
        loss={
            "lm": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            "cls": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        },
        loss_weights={"lm": 1.0, "cls": 0.5},
        metrics={"cls": ["accuracy"]},
    )


# (schedule, num_virtual_stages, split points, the stages of embed and lm, their devices).
CASES = [
    ("gpipe", 1, ["ff2"], (0, 1), (1, 2)),
    # 1F1B cuts and places as GPipe does, and runs the same actions in another order:
    # a further proof of what GPipe's case and the executor's grids prove.
    pytest.param("1f1b", 1, ["ff2"], (0, 1), (1, 2), marks=pytest.mark.extended),
    # Two stages per device: the V placement puts stages 0 and 3 (the tied pair) on
    # one device; the loop placement puts stage 3 on the second device.
    ("zbv", 1, ["ff1", "ff2", "padding"], (0, 3), (1, 1)),
    ("interleaved_1f1b", 2, ["ff1", "ff2", "padding"], (0, 3), (1, 2)),
]


@pytest.mark.parametrize("schedule,virtual,split_points,stages,devices", CASES)
def test_two_inputs_skip_tied_embedding_two_losses_fit_equals_plain(
    schedule, virtual, split_points, stages, devices
):
    keras.utils.set_random_seed(5)
    model = _Model()
    plain = _Model()  # clone_model would need TiedOutput's config to name the embedding
    plain.set_weights(model.get_weights())
    pipe = lpk.Pipeline(
        model,
        num_stages=2,
        num_micro_batches=4,
        split_points=split_points,
        schedule=schedule,
        num_virtual_stages=virtual,
        devices=DEVICES,
    )
    embed, lm = model.get_layer("embed"), model.get_layer("lm")
    # The tied matrix is used on two stages and lives on the first one's device.
    assert (pipe.pipeline.LayerStage(embed), pipe.pipeline.LayerStage(lm)) == stages
    assert [pipe.pipeline.StageDevice(s)[-1] for s in stages] == [str(d) for d in devices]
    assert embed.embeddings.value.device.endswith("CPU:1")
    for layer in model.layers:  # every weight on its stage's device, as the schedule places it
        for w in layer.weights:
            if layer is not lm:
                want = pipe.pipeline.StageDevice(pipe.pipeline.LayerStage(layer))
                assert w.value.device.endswith(want[-5:]), (layer.name, w.value.device, want)
    report = pipe.pipeline.PartitionReport()
    crossing = [name for name, _, _ in report.stages[0].crossing]
    assert "embed" in crossing and "input:mask" in crossing  # the skip and the second input
    assert [s.device for s in report.stages] == [
        pipe.pipeline.StageDevice(s) for s in range(len(report.stages))
    ]
    assert f"/device:CPU:{devices[1]}" in pipe.StagesTable().splitlines()[-1]

    x, y = _Data()
    want = plain.predict(x, verbose=0)
    got = pipe.predict(x, verbose=0)
    for key in ("lm", "cls"):
        np.testing.assert_allclose(got[key], want[key], atol=1e-5)
    _Compile(pipe)
    _Compile(plain)
    hist = pipe.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    plain_hist = plain.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(model.weights, plain.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5, err_msg=a.path)
    np.testing.assert_allclose(hist.history["loss"], plain_hist.history["loss"], rtol=1e-5)
    np.testing.assert_allclose(
        hist.history["cls_accuracy"], plain_hist.history["cls_accuracy"], rtol=1e-6
    )
    slots = pipe.optimizer.momentums
    for v, slot in zip(pipe.optimizer._trainable_variables, slots):  # noqa: SLF001
        assert slot.value.device == v.value.device, v.path
