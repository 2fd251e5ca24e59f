"""keras_hub's models, which lingpipe did not write, as pipelines: GPT-2's causal LM task
as keras_hub makes and compiles it (its logits are the token embedding used again,
reversed, so the one weight serves the first and the last stage), Llama's and Gemma's
backbones (grouped-query attention, rotary positions, RMS norms) and BERT's (three
inputs, the first token classified). Trained by fit with padded batches, a weighted loss
and Adam or AdamW, each equals the same model trained plainly: losses and metrics per
epoch, weights, predictions. GPT-2 under ZBV (both ends on the first device) and Gemma
under zero bubble are extended cases (`-m extended`): each case takes about 12 s. So is
Mixtral with one micro-batch: its routers' load-balancing loss is a function of the
batch's means, so it equals the plain model's only when the micro-batch is the batch.
"""

import warnings

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf

import lingpipe.keras as lpk

VOCAB, ROWS, LENGTH = 100, 16, 12
TINY = dict(vocabulary_size=VOCAB, num_layers=2, hidden_dim=16, intermediate_dim=32)


def _Gpt2Task():
    backbone = keras_hub.models.GPT2Backbone(
        num_heads=2, max_sequence_length=LENGTH, dropout=0.0, **TINY
    )
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


def _Gpt2CausalLm():
    task = _Gpt2Task()
    return keras.Model(task.inputs, task.outputs)


def _TokenHead(backbone):
    """The backbone with a Dense over its sequence output (a tagger of 7 classes)."""
    inputs = {
        name: keras.Input(x.shape[1:], dtype=x.dtype, name=name)
        for name, x in backbone.input.items()
    }
    return keras.Model(inputs, keras.layers.Dense(7, name="head")(backbone(inputs)))


def _Llama():
    return _TokenHead(
        keras_hub.models.LlamaBackbone(num_query_heads=2, num_key_value_heads=1, **TINY)
    )


def _Gemma():
    return _TokenHead(
        keras_hub.models.GemmaBackbone(num_query_heads=2, num_key_value_heads=1, head_dim=8, **TINY)
    )


def _Mixtral():
    """Sparse mixture-of-experts layers whose routers add a load-balancing loss (add_loss)
    taken from the batch's means: equal to the plain model's with one micro-batch."""
    return _TokenHead(
        keras_hub.models.MixtralBackbone(
            num_query_heads=2, num_key_value_heads=1, num_experts=4, top_k=2, **TINY
        )
    )


def _BertClassifier():
    backbone = keras_hub.models.BertBackbone(
        num_heads=2, max_sequence_length=LENGTH, dropout=0.0, **TINY
    )
    inputs = {
        name: keras.Input(x.shape[1:], dtype=x.dtype, name=name)
        for name, x in backbone.input.items()
    }
    first = backbone(inputs)["sequence_output"][:, 0, :]
    return keras.Model(inputs, keras.layers.Dense(7, name="head")(first))


def _Data(model, classes):
    """Token ids, a padding mask (every other row padded after 8 tokens), segment ids
    where the model takes them; labels per token or per row; the mask as weights."""
    rng = np.random.RandomState(0)
    x = {
        "token_ids": rng.randint(1, VOCAB, (ROWS, LENGTH)).astype("int32"),
        "padding_mask": np.ones((ROWS, LENGTH), "int32"),
    }
    x["padding_mask"][::2, 8:] = 0
    if "segment_ids" in model.input:
        x["segment_ids"] = (np.arange(LENGTH) >= 6).astype("int32")[None].repeat(ROWS, 0)
    per_token = len(model.outputs[0].shape) == 3
    y = rng.randint(0, classes, (ROWS, LENGTH) if per_token else (ROWS,))
    weights = x["padding_mask"].astype("float32") if per_token else None
    return x, y, weights


@pytest.mark.parametrize(
    "make, classes, optimizer, knobs",
    [
        pytest.param(
            _Gpt2CausalLm, VOCAB, "adamw", dict(schedule="zbv"), marks=pytest.mark.extended
        ),
        (_Llama, 7, "adam", dict(schedule="interleaved_1f1b", num_virtual_stages=2)),
        pytest.param(
            _Gemma,
            7,
            "adam",
            dict(schedule="zero_bubble", partition="flops"),
            marks=pytest.mark.extended,
        ),
        (_BertClassifier, 7, "adam", dict(schedule="gpipe", remat="always")),
        pytest.param(
            _Mixtral,
            7,
            "adam",
            dict(schedule="1f1b", num_micro_batches=1),
            marks=pytest.mark.extended,
        ),
    ],
    ids=["gpt2_lm-zbv", "llama-interleaved", "gemma-zb", "bert-gpipe", "mixtral-one_micro_batch"],
)
def test_a_keras_hub_model_trains_as_a_pipeline_equal_to_the_plain_model(
    make, classes, optimizer, knobs
):
    keras.utils.set_random_seed(3)
    model = make()
    plain = make()
    plain.set_weights(model.get_weights())
    pipe = lpk.Pipeline(model, num_stages=2, **dict(dict(num_micro_batches=4), **knobs))
    assert len(pipe.pipeline.devices) == 2
    x, y, weights = _Data(model, classes)
    histories = []
    for m in (plain, pipe):
        m.compile(
            optimizer=keras.optimizers.get(
                {"class_name": optimizer, "config": {"learning_rate": 1e-2}}
            ),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            weighted_metrics=["accuracy"],
        )
        fit = m.fit(x, y, sample_weight=weights, batch_size=8, epochs=2, shuffle=False, verbose=0)
        histories.append(fit.history)
    for key, values in histories[0].items():
        np.testing.assert_allclose(histories[1][key], values, rtol=1e-5, err_msg=key)
    for a, b, w in zip(plain.get_weights(), pipe.get_weights(), plain.weights):
        np.testing.assert_allclose(b, a, atol=1e-5, err_msg=w.path)
    np.testing.assert_allclose(pipe.predict(x, verbose=0), plain.predict(x, verbose=0), atol=1e-5)


def _Gpt2WithPreprocessor():
    """GPT-2's causal LM with a preprocessor: a byte-pair tokenizer of 8 tokens, and
    sequences of 8 (the labels are the inputs shifted by one)."""
    vocabulary = {"<|endoftext|>": 0, "a": 1, "b": 2, "c": 3, "Ġ": 4, "Ġa": 5, "Ġb": 6, "Ġc": 7}
    tokenizer = keras_hub.models.GPT2Tokenizer(vocabulary=vocabulary, merges=["Ġ a", "Ġ b", "Ġ c"])
    preprocessor = keras_hub.models.GPT2CausalLMPreprocessor(tokenizer, sequence_length=8)
    backbone = keras_hub.models.GPT2Backbone(
        num_heads=2, max_sequence_length=LENGTH, dropout=0.0, **dict(TINY, vocabulary_size=8)
    )
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=preprocessor)


@pytest.mark.slow  # about 30 s: keras_hub traces its tokenizer for each dataset
def test_a_keras_hub_task_with_a_preprocessor_fits_evaluates_and_predicts_on_strings(
    tmp_path,
):
    # The task's fit, evaluate and predict tokenize the strings given and make the
    # labels; the pipeline runs the task's graph, and does the same before it. The task
    # compiled with only an optimizer (keras_hub fills in its loss and weighted
    # accuracy); the pipeline is not compiled again: it starts compiled as the task.
    keras.utils.set_random_seed(3)
    task, plain = _Gpt2WithPreprocessor(), _Gpt2WithPreprocessor()
    plain.set_weights(task.get_weights())
    for m in (task, plain):
        m.compile(optimizer=keras.optimizers.Adam(1e-2))
    pipe = lpk.Pipeline(task, num_stages=2, num_micro_batches=2, schedule="1f1b", remat="always")
    texts = np.array(["a b a", "b b a c", "a a", "c a b c a", "b", "c c a"] * 4)
    validation = (texts[16:],)  # as validation_split=1/3 takes them (test below)
    fit = dict(batch_size=8, epochs=1, validation_data=validation, verbose=0)
    ours, theirs = pipe.fit(texts[:16], **fit).history, plain.fit(texts[:16], **fit).history
    assert ours.keys() == theirs.keys() >= {"loss", "val_loss", "val_sparse_categorical_accuracy"}
    for key, values in theirs.items():
        np.testing.assert_allclose(ours[key], values, rtol=1e-5, err_msg=key)
    for a, b, w in zip(plain.get_weights(), pipe.get_weights(), plain.weights):
        np.testing.assert_allclose(b, a, atol=1e-5, err_msg=w.path)
    data = tf.data.Dataset.from_tensor_slices(list(texts[:16])).batch(8)
    np.testing.assert_allclose(
        pipe.evaluate(data, verbose=0), plain.evaluate(data, verbose=0), rtol=1e-5
    )
    np.testing.assert_allclose(
        pipe.predict(list(texts[:8]), verbose=0),
        plain.predict(list(texts[:8]), verbose=0),
        atol=1e-5,
    )
    with pytest.raises(
        ValueError,
        match=r"^lingpipe.keras.Pipeline '\w+': received a tf.data.Dataset and batch_size; ",
    ):
        pipe.fit(data, batch_size=4, verbose=0)
    batch = list(texts[:8])
    np.testing.assert_allclose(pipe.train_on_batch(batch), plain.train_on_batch(batch), rtol=1e-5)
    np.testing.assert_allclose(pipe.test_on_batch(batch), plain.test_on_batch(batch), rtol=1e-5)
    predicted = pipe.predict_on_batch(batch)
    np.testing.assert_allclose(predicted, plain.predict_on_batch(batch), atol=1e-5)
    # Saved and loaded, it predicts the same; the task inside is not compiled again
    # (keras_hub's compile is its own: Keras warned that it could not).
    pipe.save(tmp_path / "pipe.keras")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = keras.saving.load_model(tmp_path / "pipe.keras")
    assert not [str(w.message) for w in caught if "compile" in str(w.message)]
    assert loaded.compiled
    np.testing.assert_allclose(loaded.predict_on_batch(batch), predicted)


def test_validation_split_with_a_preprocessor_takes_the_last_rows_of_arrays():
    # As keras.Model.fit splits arrays (and keras_hub's tasks do): the last third here.
    from lingpipe.keras import preprocessing

    def Preprocess(x, y=None, sample_weight=None):
        return keras.utils.pack_x_y_sample_weight(x * 10, y, sample_weight)

    x, y = np.arange(12, dtype="float32"), np.arange(12)
    fit = preprocessing.Fit(Preprocess, (x, y), dict(batch_size=4, validation_split=1 / 3), "p")
    assert (fit["batch_size"], fit["validation_split"], fit["y"]) == (None, 0.0, None)
    train = [b[0].numpy().tolist() for b in fit["x"]]
    held = [b[1].numpy().tolist() for b in fit["validation_data"]]
    assert train == [[0, 10, 20, 30], [40, 50, 60, 70]] and held == [[8, 9, 10, 11]]
    with pytest.raises(
        ValueError,
        match=r"^p: validation_split with a keras_hub preprocessor "
        r"needs NumPy arrays or tensors, and received str; pass np.array",
    ):
        preprocessing.Fit(Preprocess, (["a b", "c"],), dict(validation_split=0.5), "p")


class _Scale(keras.layers.Layer):
    """A preprocessor whose config holds what its preprocessing does."""

    def __init__(self, scale=10.0, **kwargs):
        super().__init__(**kwargs)
        self.scale = scale

    def get_config(self):
        return dict(super().get_config(), scale=self.scale)


class _Task:
    """Stands for a keras_hub task: a preprocessor, and preprocess_samples using it."""

    def __init__(self):
        self.preprocessor, self.traces = _Scale(), 0

    def preprocess_samples(self, x, y=None, sample_weight=None):
        self.traces += 1  # Python runs once per trace
        return keras.utils.pack_x_y_sample_weight(x * self.preprocessor.scale, y, sample_weight)


def test_the_preprocessing_is_traced_once_until_the_preprocessor_s_config_changes():
    # keras_hub maps its tokenizer afresh in every fit, evaluate and predict (GPT-2's took
    # 2.3 s to trace here, each time); the pipeline traces it once per preprocessor.
    from lingpipe.keras import preprocessing

    task, x = _Task(), np.arange(6, dtype="float32")

    def Rows(kwargs):
        return [r for batch in kwargs["x"] for r in batch.numpy().tolist()]

    for _ in range(2):
        assert Rows(preprocessing.Predict(task.preprocess_samples, (x,), {}, "p")) == [
            0, 10, 20, 30, 40, 50
        ]  # fmt: skip
    evaluated = preprocessing.Evaluate(task.preprocess_samples, (x[:3],), {}, "p")
    assert [b.numpy().tolist() for b in evaluated["x"]] == [[0, 10, 20]]
    assert task.traces == 1
    task.preprocessor.scale = 2.0  # a new config: traced again, and used
    assert Rows(preprocessing.Predict(task.preprocess_samples, (x,), {}, "p"))[1] == 2
    assert task.traces == 2
