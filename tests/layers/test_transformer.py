"""Tests of lingpipe.layers.transformer.TransformerLayer against the pre-norm formulas in NumPy."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from lingpipe import base_layer, test_utils
from lingpipe.layers import transformer

_seeds = itertools.count(1)
TOL = dict(rtol=1e-4, atol=1e-5)


def _Params(**kwargs):
    p = transformer.TransformerLayer.Params().Set(
        name="xformer", input_dims=8, num_heads=2, hidden_dims=16
    )
    return p.Set(**kwargs)


def _Build(**kwargs):
    """A layer whose biases and layer-norm scales are random too, so the reference checks them."""
    layer = _Params(**kwargs).Instantiate()
    for var in layer.trainable_variables:
        if var.shape.rank == 1:
            var.assign(np.random.normal(size=var.shape).astype(np.float32))
    return layer


def _Inputs(*shape):
    return np.random.normal(size=shape).astype(np.float32)


def _Np(vars_map):
    return {k: v.numpy() for k, v in vars_map.items() if not isinstance(v, dict)}


def _LayerNorm(w, x, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w["scale"] + w["bias"]


def _Attention(w, n, q, k, paddings, causal):
    def Heads(x, which):
        y = x @ w[f"w_{which}"] + w[f"b_{which}"]
        return y.reshape(y.shape[0], y.shape[1], n, -1)

    qh, kh, vh = Heads(q, "query"), Heads(k, "key"), Heads(k, "value")
    logits = np.einsum("btnh,bsnh->bnts", qh, kh) / np.sqrt(qh.shape[-1])
    allowed = np.ones(logits.shape, dtype=bool)
    if paddings is not None:
        allowed &= (paddings < 0.5)[:, None, None, :]
    if causal:
        allowed &= np.tril(np.ones(logits.shape[-2:], dtype=bool))
    logits = np.where(allowed, logits, -1e9)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    context = np.einsum("bnts,bsnh->btnh", probs, vh).reshape(q.shape[0], q.shape[1], -1)
    return context @ w["w_post"] + w["b_post"]


def _NumpyTransformer(layer, x, paddings=None, aux=None, aux_paddings=None):
    """The pre-norm residual formulas with the layer's weights (eval: no dropout)."""
    p = layer.params
    v = layer.vars
    eps, n = p.ln_epsilon, p.num_heads
    normed = _LayerNorm(_Np(v.self_atten_ln), x, eps)
    x = x + _Attention(_Np(v.self_atten), n, normed, normed, paddings, p.causal)
    if p.has_aux_atten:
        normed = _LayerNorm(_Np(v.aux_atten_ln), x, eps)
        x = x + _Attention(_Np(v.aux_atten), n, normed, aux, aux_paddings, False)
    normed = _LayerNorm(_Np(v.ffn_ln), x, eps)
    hidden = np.maximum(normed @ v.ffn_in.w.numpy() + v.ffn_in.b.numpy(), 0.0)
    return x + hidden @ v.ffn_out.w.numpy() + v.ffn_out.b.numpy()


def test_encoder_layer_matches_numpy():
    layer = _Build()
    x = _Inputs(2, 4, 8)
    paddings = np.array([[0, 0, 0, 1], [0, 0, 0, 0]], dtype=np.float32)
    out = layer(x, paddings)
    assert out.shape == (2, 4, 8)
    test_utils.AssertAllClose(out, _NumpyTransformer(layer, x, paddings), **TOL)
    # The reference is not vacuous: without the paddings it differs.
    with pytest.raises(AssertionError):
        test_utils.AssertAllClose(out, _NumpyTransformer(layer, x), **TOL)


def test_causal_decoder_with_aux_attention_matches_numpy():
    layer = _Build(causal=True, has_aux_atten=True, activation="relu")
    x, aux = _Inputs(2, 4, 8), _Inputs(2, 3, 8)
    paddings = np.array([[0, 0, 0, 1], [0, 0, 0, 0]], dtype=np.float32)
    aux_paddings = np.array([[0, 0, 1], [0, 0, 0]], dtype=np.float32)
    out = layer(x, paddings, aux, aux_paddings)
    expected = _NumpyTransformer(layer, x, paddings, aux, aux_paddings)
    test_utils.AssertAllClose(out, expected, **TOL)
    # Later positions do not change earlier outputs.
    changed = x.copy()
    changed[:, 2:] = _Inputs(2, 2, 8)
    new_out = layer(changed, paddings, aux, aux_paddings).numpy()
    np.testing.assert_array_equal(new_out[:, :2], out.numpy()[:, :2])
    assert not np.allclose(new_out[:, 2:], out.numpy()[:, 2:])


def test_children_and_their_params():
    layer = _Build(has_aux_atten=True, causal=True, dropout_prob=0.1, atten_dropout_prob=0.2)
    assert sorted(layer.children) == sorted(
        [
            "self_atten_ln",
            "self_atten",
            "aux_atten_ln",
            "aux_atten",
            "ffn_ln",
            "ffn_in",
            "ffn_out",
            "residual_dropout",
        ]
    )
    assert layer.self_atten.params.causal and not layer.aux_atten.params.causal
    assert layer.residual_dropout.params.keep_prob == pytest.approx(0.9)
    assert layer.self_atten.atten_dropout.params.keep_prob == pytest.approx(0.8)
    assert layer.ffn_in.params.activation == "RELU" and layer.ffn_out.params.activation == "NONE"
    assert "aux_atten" not in _Build().children


def test_dropout_only_in_training():
    layer = _Build(dropout_prob=0.3, atten_dropout_prob=0.3, has_aux_atten=True)
    x, aux = _Inputs(2, 4, 8), _Inputs(2, 3, 8)
    expected = _NumpyTransformer(layer, x, aux=aux)
    with base_layer.EvalMode():
        test_utils.AssertAllClose(layer(x, aux_vecs=aux), expected, **TOL)
    train = layer(x, aux_vecs=aux).numpy()
    assert not np.allclose(train, expected, rtol=1e-3, atol=1e-3)
    # Stateless masks: the same call gives the same numbers.
    np.testing.assert_array_equal(layer(x, aux_vecs=aux).numpy(), train)


def test_eager_equals_function():
    layer = _Build(causal=True, has_aux_atten=True, dropout_prob=0.2, atten_dropout_prob=0.2)
    x, aux = tf.constant(_Inputs(2, 4, 8)), tf.constant(_Inputs(2, 3, 8))
    paddings = tf.constant([[0, 0, 0, 1], [0, 0, 0, 0]], dtype=tf.float32)
    test_utils.AssertEagerEqualsFunction(lambda a, b, c: layer(a, b, c), x, paddings, aux)


def test_gradients_reach_every_variable():
    layer = _Build(has_aux_atten=True, dropout_prob=0.1)
    x, aux = tf.constant(_Inputs(2, 3, 8)), tf.constant(_Inputs(2, 2, 8))
    test_utils.AssertGradientsExist(layer, lambda: tf.reduce_sum(layer(x, aux_vecs=aux) ** 2))
    # 2 attentions x 8 + 3 layer norms x 2 + 2 projections x 2.
    assert len(layer.trainable_variables) == 26


def test_fprop_meta():
    b, t, s, d, h, f = 2, 4, 3, 8, 8, 16
    p = _Params(has_aux_atten=True)
    with test_utils.CountVariables() as counter:
        meta = transformer.TransformerLayer.FPropMeta(p, [b, t, d], [b, t], [b, s, d], [b, s])
    assert counter.count == 0
    assert meta.out_shapes == (tf.TensorShape([b, t, d]),)
    layer = p.Instantiate()
    # Every variable of the layer is trainable.
    assert meta.num_params == sum(int(np.prod(v.shape)) for v in layer.trainable_variables)
    assert meta.num_params == sum(int(np.prod(v.shape)) for v in layer.variables)
    self_atten = 2 * b * (2 * t * d * h + 2 * t * d * h + 2 * t * t * h)
    aux_atten = 2 * b * (2 * t * d * h + 2 * s * d * h + 2 * t * s * h)
    layer_norms = 3 * 8 * b * t * d
    ffn = b * t * f * (2 * d + 2) + b * t * d * (2 * f + 1)
    residual_adds = 3 * b * t * d
    assert meta.flops == self_atten + aux_atten + layer_norms + ffn + residual_adds
    enc = transformer.TransformerLayer.FPropMeta(_Params(), [b, t, d])
    assert enc.num_params == meta.num_params - (4 * d * h + 3 * h + d) - 2 * d


def test_checkpoint_round_trip(tmp_path):
    x = tf.constant(_Inputs(2, 3, 8))
    test_utils.CheckpointRoundTrip(lambda: _Build(random_seed=next(_seeds)), x, str(tmp_path))


def test_variable_names_follow_path():
    names = {v.name for v in _Build(has_aux_atten=True).variables}
    for name in (
        "xformer/self_atten/w_query:0",
        "xformer/aux_atten/b_post:0",
        "xformer/self_atten_ln/scale:0",
        "xformer/ffn_ln/bias:0",
        "xformer/ffn_in/w:0",
        "xformer/ffn_out/b:0",
    ):
        assert name in names


def test_aux_attention_needs_aux_vecs():
    x = _Inputs(1, 3, 8)
    with pytest.raises(ValueError, match=r"xformer: has_aux_atten=True requires aux_vecs"):
        _Build(has_aux_atten=True)(x)
    with pytest.raises(ValueError, match=r"but has_aux_atten=False"):
        _Build()(x, aux_vecs=x)
    with pytest.raises(ValueError, match=r"has_aux_atten=True requires aux_vecs_shape"):
        transformer.TransformerLayer.FPropMeta(_Params(has_aux_atten=True), [1, 3, 8])


def test_mismatched_input_dims():
    layer = _Build(has_aux_atten=True)
    with pytest.raises(
        ValueError, match=r"xformer: expected inputs.shape\[-1\] == input_dims, .*=6, input_dims=8"
    ):
        layer(_Inputs(1, 3, 6), aux_vecs=_Inputs(1, 2, 8))
    with pytest.raises(ValueError, match=r"xformer/aux_atten: .*key_vec.shape\[-1\]=4"):
        layer(_Inputs(1, 3, 8), aux_vecs=_Inputs(1, 2, 4))
    with pytest.raises(ValueError, match=r"received \[1,3,6\]|input_shape\[-1\]"):
        transformer.TransformerLayer.FPropMeta(_Params(), [1, 3, 6])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_heads=3), r"xformer/self_atten: .*hidden_dims=8, num_heads=3"),
        (dict(hidden_dims=0), r"xformer: expected hidden_dims to be a positive integer"),
        (dict(input_dims=-1), r"xformer: .*received input_dims=-1"),
        (dict(activation="nope"), r"xformer: unknown activation 'nope'"),
        (dict(dropout_prob=1.0), r"xformer: expected 0 <= dropout_prob < 1"),
        (dict(atten_dropout_prob=1.0), r"atten_dropout_prob=1.0"),
        (dict(ln_epsilon=0.0), r"xformer/self_atten_ln: expected epsilon > 0"),
    ],
)
def test_bad_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _Params(**kwargs).Instantiate()
    with pytest.raises(ValueError):
        transformer.TransformerLayer.FPropMeta(_Params(**kwargs), [1, 2, 8])
