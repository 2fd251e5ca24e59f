"""Tests of lingpipe.layers.embedding."""

import math

import numpy as np
import pytest
import tensorflow as tf

from lingpipe import base_layer, test_utils
from lingpipe.layers import embedding, softmax
from lingpipe.nested_map import NestedMap

VOCAB, DIM = 7, 4


def _Params(**kwargs):
    p = embedding.EmbeddingLayer.Params().Set(name="tok_emb", vocab_size=VOCAB, embedding_dim=DIM)
    return p.Set(**kwargs)


def _Ids():
    return tf.constant([[0, 3, 6], [1, 1, 2]], dtype=tf.int32)


def test_lookup_matches_numpy():
    layer = _Params().Instantiate()
    emb = layer.vars.emb.numpy()
    out = layer(_Ids())
    assert out.shape == (2, 3, DIM)
    test_utils.AssertAllClose(out, emb[_Ids().numpy()])


def test_lookup_int64_ids():
    layer = _Params().Instantiate()
    ids = tf.constant([5, 0], dtype=tf.int64)
    test_utils.AssertAllClose(layer(ids), layer.vars.emb.numpy()[[5, 0]])


def test_scaled_lookup_matches_numpy():
    layer = _Params(scale_sqrt_depth=True).Instantiate()
    emb = layer.vars.emb.numpy()
    test_utils.AssertAllClose(layer(_Ids()), emb[_Ids().numpy()] * math.sqrt(DIM))


def test_default_init_is_gaussian_over_sqrt_dim():
    layer = _Params(vocab_size=512, embedding_dim=16).Instantiate()
    emb = layer.vars.emb.numpy()
    # 8192 draws: the std estimate is within ~1% of 1/sqrt(16) = 0.25.
    assert abs(emb.std() - 0.25) < 0.01
    assert abs(emb.mean()) < 0.01


def test_changed_params_init_is_used():
    layer = _Params(params_init=base_layer.WeightInit.Constant(0.5)).Instantiate()
    np.testing.assert_array_equal(layer.vars.emb.numpy(), np.full([VOCAB, DIM], 0.5, np.float32))


def test_logits_is_inputs_times_emb_transposed():
    layer = _Params().Instantiate()
    emb = layer.vars.emb.numpy()
    inputs = np.random.normal(size=[2, 3, DIM]).astype(np.float32)
    logits = layer.Logits(layer.theta, inputs)
    assert logits.shape == (2, 3, VOCAB)
    test_utils.AssertAllClose(logits, inputs @ emb.T, rtol=1e-5, atol=1e-5)
    flat = np.random.normal(size=[5, DIM]).astype(np.float32)
    test_utils.AssertAllClose(layer.Logits(layer.theta, flat), flat @ emb.T, atol=1e-5)


def test_fprop_and_logits_use_theta_not_vars():
    layer = _Params().Instantiate()
    table = np.arange(VOCAB * DIM, dtype=np.float32).reshape(VOCAB, DIM)
    theta = NestedMap(emb=tf.constant(table))
    test_utils.AssertAllClose(layer.FProp(theta, _Ids()), table[_Ids().numpy()])
    inputs = np.ones([2, DIM], np.float32)
    test_utils.AssertAllClose(layer.Logits(theta, inputs), inputs @ table.T)


def test_tied_softmax_gradient_reaches_the_table_from_both_uses():
    layer = _Params().Instantiate()
    ids, labels = _Ids(), tf.constant([[3, 6, 1], [2, 0, 4]])

    def Loss():
        hidden = layer.FProp(layer.theta, ids)
        return softmax.CrossEntropy(layer.Logits(layer.theta, hidden), class_ids=labels).avg_xent

    test_utils.AssertGradientsExist(layer, Loss)
    grad = test_utils.GradientsOf(layer, Loss)["tok_emb/emb:0"]
    # Row 5 is never looked up, so its gradient comes from the logits alone: nonzero.
    assert np.abs(np.asarray(tf.convert_to_tensor(grad))[5]).sum() > 0


def test_gradients_exist():
    layer = _Params(scale_sqrt_depth=True).Instantiate()
    test_utils.AssertGradientsExist(layer, lambda: tf.reduce_sum(layer(_Ids()) ** 2))


def test_eager_equals_function():
    layer = _Params(scale_sqrt_depth=True).Instantiate()
    test_utils.AssertEagerEqualsFunction(layer, _Ids())
    inputs = tf.random.normal([2, 3, DIM])
    test_utils.AssertEagerEqualsFunction(lambda x: layer.Logits(layer.theta, x), inputs)


def test_variable_names_follow_path():
    layer = _Params().Instantiate()
    assert [v.name for v in layer.trainable_variables] == ["tok_emb/emb:0"]
    assert layer.vars.emb.shape == (VOCAB, DIM)


@pytest.mark.parametrize("scale", [False, True])
def test_fprop_meta(scale):
    p = _Params(scale_sqrt_depth=scale)
    with test_utils.CountVariables() as counter:
        meta = embedding.EmbeddingLayer.FPropMeta(p, [2, 3])
    assert counter.count == 0
    assert meta.out_shapes == (tf.TensorShape([2, 3, DIM]),)
    # A gather costs no multiplies; scaling is one multiply per output element.
    assert meta.flops == (2 * 3 * DIM if scale else 0)
    assert meta.num_params == VOCAB * DIM
    layer = p.Instantiate()
    # Trainable variables only: the layer has no non-trainable ones.
    assert meta.num_params == sum(int(np.prod(v.shape)) for v in layer.trainable_variables)
    assert layer(_Ids()).shape == meta.out_shapes[0]


def test_fprop_meta_unknown_dims():
    meta = embedding.EmbeddingLayer.FPropMeta(_Params(), tf.TensorShape([None, 3]))
    assert meta.out_shapes[0].as_list() == [None, 3, DIM]
    assert meta.flops == 0
    with pytest.raises(ValueError, match=r"tok_emb: FPropMeta needs every ids dim known"):
        embedding.EmbeddingLayer.FPropMeta(_Params(scale_sqrt_depth=True), [None, 3])


def test_checkpoint_round_trip(tmp_path):
    seeds = iter([1, 2])
    test_utils.CheckpointRoundTrip(
        lambda: _Params(random_seed=next(seeds)).Instantiate(), _Ids(), str(tmp_path)
    )


def test_different_seeds_give_different_tables():
    a = _Params(random_seed=1).Instantiate().vars.emb.numpy()
    b = _Params(random_seed=2).Instantiate().vars.emb.numpy()
    assert not np.allclose(a, b)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(vocab_size=0),
            r"tok_emb: expected vocab_size to be a positive integer, "
            r"received vocab_size=0",
        ),
        (dict(vocab_size=-3), r"received vocab_size=-3"),
        (
            dict(embedding_dim=0),
            r"tok_emb: expected embedding_dim to be a positive integer, "
            r"received embedding_dim=0",
        ),
        (dict(scale_sqrt_depth="yes"), r"expected scale_sqrt_depth to be a bool"),
    ],
)
def test_bad_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _Params(**kwargs).Instantiate()
    with pytest.raises(ValueError, match=message):
        embedding.EmbeddingLayer.FPropMeta(_Params(**kwargs), [2])


def test_float_ids_are_refused():
    layer = _Params().Instantiate()
    with pytest.raises(ValueError, match=r"tok_emb: expected integer ids, received ids.dtype"):
        layer(tf.constant([1.0, 2.0]))


def test_logits_mismatched_input_dims():
    layer = _Params().Instantiate()
    with pytest.raises(
        ValueError,
        match=r"tok_emb: expected inputs.shape\[-1\] == embedding_dim, received "
        r"inputs.shape\[-1\]=6, embedding_dim=4",
    ):
        layer.Logits(layer.theta, tf.zeros([2, 6]))
    with pytest.raises(ValueError, match=r"tok_emb: expected inputs of rank >= 1"):
        layer.Logits(layer.theta, tf.constant(1.0))
