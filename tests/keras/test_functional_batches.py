"""lingpipe.keras.Pipeline with batches of any size: a partial last batch in fit, evaluate
and predict (the batch is unknown when the step is traced)."""

import keras
import numpy as np

import lingpipe.keras as lpk

DEVICES = ["/device:CPU:1", "/device:CPU:2"]


def _Data(n, dims=6):
    rng = np.random.RandomState(0)
    return rng.randn(n, dims).astype(np.float32), rng.randn(n, 1).astype(np.float32)


def test_partial_last_batch_fit_evaluate_predict_equal_plain():
    """18 examples in batches of 8: the last batch has 2 rows (M=2: one row each)."""
    keras.utils.set_random_seed(4)
    x = keras.Input((6,))
    h = keras.layers.Dense(8, activation="tanh", name="d1")(x)
    model = keras.Model(x, keras.layers.Dense(1, name="out")(h))
    plain = keras.models.clone_model(model)
    plain.set_weights(model.get_weights())
    xs, ys = _Data(18)
    pipe = lpk.Pipeline(model, num_stages=2, num_micro_batches=2, devices=DEVICES)
    for m in (pipe, plain):
        m.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        m.fit(xs, ys, batch_size=8, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(model.weights, plain.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-6)
    np.testing.assert_allclose(
        pipe.evaluate(xs, ys, batch_size=8, verbose=0),
        plain.evaluate(xs, ys, batch_size=8, verbose=0),
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        pipe.predict(xs, batch_size=8, verbose=0), plain.predict(xs, verbose=0), atol=1e-6
    )
