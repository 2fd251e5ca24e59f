"""keras.io's text classification with a Transformer, as its users write it: registered
custom layers (a token-and-position embedding, a transformer block), int32 token ids fed
to a float32 keras.Input, Adam (so the embeddings' gradients must reach the optimizer as
slices), validation_split. Through lingpipe.keras.Pipeline it fits as the plain model.

The example's dropout is 0 here: the pipeline draws dropout masks from stateless seeds
per micro-batch (so recomputation replays them), not from the plain model's generator.
"""

import keras
import numpy as np
import pytest

import lingpipe.keras as lpk

VOCAB, MAXLEN, DIMS, HEADS, HIDDEN = 200, 16, 16, 2, 16


@keras.saving.register_keras_serializable(package="lingpipe_keras_io")
class TransformerBlock(keras.layers.Layer):
    """Self-attention and a feed-forward net, each with a residual and layer norm."""

    def __init__(self, dims, heads, hidden, rate=0.0, **kwargs):
        super().__init__(**kwargs)
        self.dims, self.heads, self.hidden, self.rate = dims, heads, hidden, rate
        self.attention = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=dims)
        self.ffn = keras.Sequential(
            [keras.layers.Dense(hidden, activation="relu"), keras.layers.Dense(dims)]
        )
        self.norm1 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.norm2 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.drop1 = keras.layers.Dropout(rate)
        self.drop2 = keras.layers.Dropout(rate)

    def call(self, x, training=None):
        attended = self.drop1(self.attention(x, x), training=training)
        x = self.norm1(x + attended)
        return self.norm2(x + self.drop2(self.ffn(x), training=training))

    def get_config(self):
        config = dict(dims=self.dims, heads=self.heads, hidden=self.hidden, rate=self.rate)
        return dict(super().get_config(), **config)


@keras.saving.register_keras_serializable(package="lingpipe_keras_io")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """ids [batch, maxlen] -> token embedding + position embedding [batch, maxlen, dims]."""

    def __init__(self, maxlen, vocab, dims, **kwargs):
        super().__init__(**kwargs)
        self.maxlen, self.vocab, self.dims = maxlen, vocab, dims
        self.tokens = keras.layers.Embedding(vocab, dims)
        self.positions = keras.layers.Embedding(maxlen, dims)

    def call(self, x):
        where = keras.ops.arange(0, keras.ops.shape(x)[-1])
        return self.tokens(x) + self.positions(where)

    def get_config(self):
        config = dict(maxlen=self.maxlen, vocab=self.vocab, dims=self.dims)
        return dict(super().get_config(), **config)


def _Classifier():
    keras.utils.set_random_seed(11)
    inputs = keras.Input(shape=(MAXLEN,))  # float32, as keras.io writes it
    x = TokenAndPositionEmbedding(MAXLEN, VOCAB, DIMS)(inputs)
    x = TransformerBlock(DIMS, HEADS, HIDDEN)(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    x = keras.layers.Dropout(0.0)(x)
    x = keras.layers.Dense(16, activation="relu")(x)
    x = keras.layers.Dropout(0.0)(x)
    outputs = keras.layers.Dense(2, activation="softmax")(x)
    return keras.Model(inputs, outputs)


@pytest.mark.grappler
@pytest.mark.slow
def test_keras_io_transformer_classifier_fits_as_the_plain_model():
    rng = np.random.RandomState(0)
    x = rng.randint(0, VOCAB, (80, MAXLEN)).astype("int32")  # int32 ids
    y = rng.randint(0, 2, 80)
    plain, base = _Classifier(), _Classifier()
    model = lpk.Pipeline(base, num_stages=2, num_micro_batches=4, schedule="1f1b")
    histories = []
    for m in (plain, model):
        m.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        fit = m.fit(x, y, batch_size=16, epochs=2, validation_split=0.2, shuffle=False, verbose=0)
        histories.append(fit.history)
    assert set(histories[1]) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    for key, values in histories[0].items():
        np.testing.assert_allclose(histories[1][key], values, rtol=1e-5, err_msg=key)
    for a, b in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        model.predict(x, batch_size=16, verbose=0),
        plain.predict(x, batch_size=16, verbose=0),
        rtol=1e-5,
        atol=1e-6,
    )
