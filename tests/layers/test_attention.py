"""Tests of lingpipe.layers.attention.MultiHeadedAttention against a NumPy reference."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from lingpipe import base_layer, test_utils
from lingpipe.layers import attention

_seeds = itertools.count(1)


def _Params(**kwargs):
    p = attention.MultiHeadedAttention.Params().Set(name="atten", input_dims=8, num_heads=2)
    return p.Set(**kwargs)


def _Build(**kwargs):
    """A layer whose biases are random too, so that the reference checks them."""
    layer = _Params(**kwargs).Instantiate()
    for name in ("b_query", "b_key", "b_value", "b_post"):
        if name in layer.vars:
            var = layer.vars[name]
            var.assign(np.random.normal(size=var.shape).astype(np.float32))
    return layer


def _Inputs(*shape):
    return np.random.normal(size=shape).astype(np.float32)


def _Softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _NumpyAttention(layer, q, k=None, v=None, paddings=None, causal=False):
    """(encoded, probs) of scaled dot-product attention with the layer's weights."""
    k = q if k is None else k
    v = k if v is None else v
    w = {name: var.numpy() for name, var in layer.vars.items() if name != "atten_dropout"}
    n = layer.params.num_heads

    def Heads(x, which):
        y = x @ w[f"w_{which}"] + w.get(f"b_{which}", 0.0)
        return y.reshape(y.shape[0], y.shape[1], n, -1)

    qh, kh, vh = Heads(q, "query"), Heads(k, "key"), Heads(v, "value")
    logits = np.einsum("btnh,bsnh->bnts", qh, kh) / np.sqrt(qh.shape[-1])
    allowed = np.ones(logits.shape, dtype=bool)
    if paddings is not None:
        allowed &= (paddings < 0.5)[:, None, None, :]
    if causal:
        allowed &= np.tril(np.ones(logits.shape[-2:], dtype=bool))
    probs = _Softmax(np.where(allowed, logits, -1e9))
    context = np.einsum("bnts,bsnh->btnh", probs, vh)
    context = context.reshape(context.shape[0], context.shape[1], -1)
    return context @ w["w_post"] + w.get("b_post", 0.0), probs


def test_self_attention_matches_numpy():
    layer = _Build(hidden_dims=12, num_heads=3)
    x = _Inputs(2, 5, 8)
    encoded, probs = layer(x)
    assert encoded.shape == (2, 5, 8) and probs.shape == (2, 3, 5, 5)
    expected = _NumpyAttention(layer, x)
    test_utils.AssertAllClose((encoded, probs), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.sum(probs, axis=-1), 1.0, rtol=1e-6)


def test_hidden_dims_zero_means_input_dims_and_no_bias():
    layer = _Build(use_bias=False)
    assert layer.vars.w_query.shape == (8, 8) and layer.vars.w_post.shape == (8, 8)
    assert "b_query" not in layer.vars and "b_post" not in layer.vars
    x = _Inputs(2, 3, 8)
    test_utils.AssertAllClose(layer(x), _NumpyAttention(layer, x), rtol=1e-5, atol=1e-5)


def test_causal_mask():
    layer = _Build(causal=True)
    x = _Inputs(2, 6, 8)
    encoded, probs = layer(x)
    above = np.triu(np.ones([6, 6], dtype=bool), k=1)
    assert np.all(probs.numpy()[..., above] == 0.0)
    assert np.all(probs.numpy()[..., ~above] > 0.0)
    test_utils.AssertAllClose(
        (encoded, probs), _NumpyAttention(layer, x, causal=True), rtol=1e-5, atol=1e-5
    )
    # Changing later positions leaves the outputs at earlier ones unchanged.
    changed = x.copy()
    changed[:, 4:] = _Inputs(2, 2, 8)
    new_encoded, _ = layer(changed)
    np.testing.assert_array_equal(new_encoded.numpy()[:, :4], encoded.numpy()[:, :4])
    assert not np.allclose(new_encoded.numpy()[:, 4:], encoded.numpy()[:, 4:])


def test_key_paddings_get_no_attention():
    layer = _Build()
    x = _Inputs(3, 4, 8)
    paddings = np.array([[0, 0, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=np.float32)
    encoded, probs = layer(x, paddings=paddings)
    padded = np.broadcast_to(paddings[:, None, None, :] > 0.5, probs.shape)
    assert np.all(probs.numpy()[:2][padded[:2]] == 0.0)
    assert np.all(probs.numpy()[:2][~padded[:2]] > 0.0)
    # A fully padded row gives uniform probabilities, not NaN.
    assert np.all(np.isfinite(encoded.numpy()))
    np.testing.assert_allclose(probs.numpy()[2], 0.25, rtol=1e-6)
    expected = _NumpyAttention(layer, x, paddings=paddings)
    test_utils.AssertAllClose((encoded, probs), expected, rtol=1e-5, atol=1e-5)
    # Padded keys do not change the result: dropping them gives the same output.
    short, _ = layer(x[:1], x[:1, :2], paddings=paddings[:1, :2])
    np.testing.assert_allclose(encoded.numpy()[:1], short.numpy(), rtol=1e-5, atol=1e-5)


def test_cross_attention_source_length_differs():
    layer = _Build(hidden_dims=4, num_heads=2)
    q, k, v = _Inputs(2, 3, 8), _Inputs(2, 5, 8), _Inputs(2, 5, 8)
    paddings = np.array([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]], dtype=np.float32)
    encoded, probs = layer(q, k, v, paddings=paddings)
    assert encoded.shape == (2, 3, 8) and probs.shape == (2, 2, 3, 5)
    expected = _NumpyAttention(layer, q, k, v, paddings=paddings)
    test_utils.AssertAllClose((encoded, probs), expected, rtol=1e-5, atol=1e-5)
    # value_vec defaults to key_vec.
    test_utils.AssertAllClose(layer(q, k), _NumpyAttention(layer, q, k, k), rtol=1e-5, atol=1e-5)


def test_reference_catches_a_wrong_scale():
    # The check above is not vacuous: a reference without 1/sqrt(head_dim) fails it.
    layer = _Build()
    x = _Inputs(2, 4, 8)
    wrong = _NumpyAttention(layer, x * 2.0)
    with pytest.raises(AssertionError):
        test_utils.AssertAllClose(layer(x), wrong, rtol=1e-5, atol=1e-5)


def test_dropout_only_in_training():
    layer = _Build(atten_dropout_prob=0.5)
    assert layer.atten_dropout.params.keep_prob == 0.5
    x = _Inputs(2, 6, 8)
    expected = _NumpyAttention(layer, x)
    with base_layer.EvalMode():
        test_utils.AssertAllClose(layer(x), expected, rtol=1e-5, atol=1e-5)
    train_encoded, train_probs = layer(x)
    # probs are returned before dropout; the encoding uses the dropped ones.
    np.testing.assert_allclose(train_probs.numpy(), expected[1], rtol=1e-5, atol=1e-6)
    assert not np.allclose(train_encoded.numpy(), expected[0], rtol=1e-3, atol=1e-3)


def test_eager_equals_function():
    layer = _Build(causal=True, atten_dropout_prob=0.3)
    x = tf.constant(_Inputs(2, 4, 8))
    paddings = tf.constant([[0, 0, 0, 1], [0, 0, 0, 0]], dtype=tf.float32)
    test_utils.AssertEagerEqualsFunction(lambda a, b: layer(a, paddings=b), x, paddings)
    cross = _Build()
    k = tf.constant(_Inputs(2, 5, 8))
    test_utils.AssertEagerEqualsFunction(lambda a, b: cross(a, b), x, k)


def test_gradients_reach_every_variable():
    layer = _Build(atten_dropout_prob=0.2)
    q, k = tf.constant(_Inputs(2, 3, 8)), tf.constant(_Inputs(2, 4, 8))
    test_utils.AssertGradientsExist(layer, lambda: tf.reduce_sum(layer(q, k)[0] ** 2))
    assert len(layer.trainable_variables) == 8


def test_theta_substitution():
    layer = _Build(use_bias=False)
    x = _Inputs(1, 3, 8)
    theta = layer.theta
    theta.w_post = tf.zeros_like(theta.w_post)
    encoded, _ = layer.FProp(theta, x)
    np.testing.assert_array_equal(encoded.numpy(), np.zeros([1, 3, 8], np.float32))


def test_fprop_meta():
    p = _Params(hidden_dims=6, num_heads=3)
    with test_utils.CountVariables() as counter:
        meta = attention.MultiHeadedAttention.FPropMeta(p, [2, 3, 8], tf.TensorShape([2, 5, 8]))
    assert counter.count == 0
    assert meta.out_shapes == (tf.TensorShape([2, 3, 8]), tf.TensorShape([2, 3, 3, 5]))
    b, t, s, d, h = 2, 3, 5, 8, 6
    assert meta.flops == 2 * b * t * d * h * 2 + 2 * b * s * d * h * 2 + 2 * b * t * s * h * 2
    layer = p.Instantiate()
    # All of this layer's variables are trainable.
    assert meta.num_params == sum(int(np.prod(v.shape)) for v in layer.trainable_variables)
    assert meta.num_params == sum(int(np.prod(v.shape)) for v in layer.variables)
    self_meta = attention.MultiHeadedAttention.FPropMeta(_Params(use_bias=False), [1, 4, 8])
    assert self_meta.out_shapes[1] == tf.TensorShape([1, 2, 4, 4])
    assert self_meta.num_params == 4 * 8 * 8


def test_checkpoint_round_trip(tmp_path):
    x = tf.constant(_Inputs(2, 3, 8))
    test_utils.CheckpointRoundTrip(lambda: _Build(random_seed=next(_seeds)), x, str(tmp_path))


def test_variable_names_follow_path():
    names = sorted(v.name for v in _Build().variables)
    expected = [f"atten/{n}:0" for n in ("b_key", "b_post", "b_query", "b_value")]
    expected += [f"atten/{n}:0" for n in ("w_key", "w_post", "w_query", "w_value")]
    assert names == expected


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(hidden_dims=10, num_heads=3), r"atten: .*hidden_dims=10, num_heads=3"),
        (dict(num_heads=3), r"hidden_dims=8, num_heads=3"),
        (dict(input_dims=0), r"atten: expected input_dims to be a positive integer"),
        (dict(num_heads=0), r"num_heads to be a positive integer, received num_heads=0"),
        (dict(hidden_dims=-4), r"hidden_dims=-4; 0 means input_dims"),
        (dict(atten_dropout_prob=1.0), r"atten_dropout_prob=1.0"),
    ],
)
def test_bad_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _Params(**kwargs).Instantiate()
    with pytest.raises(ValueError, match=match.replace("atten: ", "")):
        attention.MultiHeadedAttention.FPropMeta(_Params(**kwargs), [1, 2, 8])


def test_causal_requires_self_attention():
    layer = _Build(causal=True)
    x = _Inputs(1, 3, 8)
    with pytest.raises(ValueError, match=r"atten: causal=True requires self-attention"):
        layer(x, x)
    with pytest.raises(ValueError, match=r"causal=True requires self-attention"):
        layer(x, value_vec=x)


def test_mismatched_input_dims():
    layer = _Build()
    with pytest.raises(
        ValueError,
        match=r"atten: expected query_vec.shape\[-1\] == input_dims, "
        r"received query_vec.shape\[-1\]=6, input_dims=8",
    ):
        layer(_Inputs(1, 3, 6))
    with pytest.raises(ValueError, match=r"key_vec.shape\[-1\]=4, input_dims=8"):
        layer(_Inputs(1, 3, 8), _Inputs(1, 3, 4))
    with pytest.raises(ValueError, match=r"key_vec.shape\[1\]=3, value_vec.shape\[1\]=2"):
        layer(_Inputs(1, 3, 8), _Inputs(1, 3, 8), _Inputs(1, 2, 8))
    with pytest.raises(ValueError, match=r"paddings.shape\[1\]=2, key_vec.shape\[1\]=3"):
        layer(_Inputs(1, 3, 8), paddings=np.zeros([1, 2], np.float32))
    with pytest.raises(ValueError, match=r"query_vec.shape.rank == 3"):
        layer(_Inputs(3, 8))
    with pytest.raises(ValueError, match=r"FPropMeta needs known batch and time"):
        attention.MultiHeadedAttention.FPropMeta(_Params(), [None, 3, 8])
