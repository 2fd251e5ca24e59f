"""Tests of DropoutLayer: stateless masks keyed by step/micro-batch scopes, eval identity."""

import numpy as np
import pytest
import tensorflow as tf

from lingpipe import base_layer, seeds, test_utils
from lingpipe.layers import dropout


def _Dropout(name="dropout", keep_prob=0.5, **kwargs):
    return dropout.DropoutLayer.Params().Set(name=name, keep_prob=keep_prob, **kwargs)


def _Inputs(*shape):
    # Never 0, so a zero in the output always means "dropped".
    return np.random.uniform(1.0, 2.0, shape).astype(np.float32)


def _Mask(layer, x):
    return layer(x).numpy() != 0


def test_same_scope_and_seed_same_mask():
    layer = _Dropout().Instantiate()
    x = _Inputs(4, 16)
    with seeds.StepSeedScope(7):
        first = layer(x)
        second = test_utils.AssertEagerEqualsFunction(layer, x)  # Eager == tf.function too.
    np.testing.assert_array_equal(first.numpy(), second)
    mask = first.numpy() != 0
    assert 0 < mask.sum() < mask.size
    # Kept elements are scaled by 1 / keep_prob; the output is inputs * mask / keep_prob.
    test_utils.AssertAllClose(first, x * mask / 0.5)


def test_scope_values_and_random_seed_change_the_mask():
    x = _Inputs(4, 16)
    layer = _Dropout(random_seed=1).Instantiate()
    with seeds.StepSeedScope(3):
        with seeds.StepSeedScope(0):
            mb0 = _Mask(layer, x)
        with seeds.StepSeedScope(1):
            mb1 = _Mask(layer, x)
        with seeds.StepSeedScope(0):
            mb0_again = _Mask(layer, x)
    with seeds.StepSeedScope(3, 0):
        other_seed = _Mask(_Dropout(random_seed=2).Instantiate(), x)
        other_path = _Mask(_Dropout(name="other", random_seed=1).Instantiate(), x)
    np.testing.assert_array_equal(mb0, mb0_again)
    assert not np.array_equal(mb0, mb1)
    assert not np.array_equal(mb0, other_seed)
    assert not np.array_equal(mb0, other_path)


def test_step_tensor_in_function_needs_no_retrace():
    layer = _Dropout().Instantiate()
    x = tf.constant(_Inputs(4, 16))

    @tf.function
    def Step(step):
        with seeds.StepSeedScope(step):
            return layer(x)

    a, b, a_again = Step(tf.constant(1)), Step(tf.constant(2)), Step(tf.constant(1))
    assert Step.experimental_get_tracing_count() == 1
    np.testing.assert_array_equal(a.numpy(), a_again.numpy())
    assert not np.array_equal(a.numpy(), b.numpy())
    with seeds.StepSeedScope(1):  # Same seed eagerly as traced with a tensor step.
        np.testing.assert_array_equal(layer(x).numpy(), a.numpy())


def test_eval_and_keep_prob_one_are_identity():
    x = _Inputs(3, 5)
    with base_layer.EvalMode():
        np.testing.assert_array_equal(_Dropout().Instantiate()(x).numpy(), x)
    np.testing.assert_array_equal(_Dropout(keep_prob=1.0).Instantiate()(x).numpy(), x)


def test_keep_fraction_close_to_keep_prob():
    x = _Inputs(100, 100)
    out = _Dropout(keep_prob=0.8).Instantiate()(x).numpy()
    kept = out != 0
    # 10,000 Bernoulli(0.8): the standard deviation of the fraction is 0.004.
    assert abs(kept.mean() - 0.8) < 0.02
    test_utils.AssertAllClose(out[kept], x[kept] / 0.8)


def test_noise_shape_broadcast_dims():
    x = _Inputs(4, 6, 8)  # [batch, time, dims]
    mask = _Mask(_Dropout(noise_shape_broadcast_dims=[1]).Instantiate(), x)
    for t in range(1, 6):  # One mask for every time step.
        np.testing.assert_array_equal(mask[:, t], mask[:, 0])
    assert 0 < mask.sum() < mask.size
    mask = _Mask(_Dropout(noise_shape_broadcast_dims=[0, -1]).Instantiate(), x)
    np.testing.assert_array_equal(mask, np.broadcast_to(mask[:1, :, :1], mask.shape))
    with pytest.raises(ValueError, match=r"dropout: noise_shape_broadcast_dims=\[3\] has dims"):
        _Dropout(noise_shape_broadcast_dims=[3]).Instantiate()(x)


def _GradOfInputs(fn, x, w):
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(fn(x) * w)
    return tape.gradient(loss, x)


def test_recompute_grad_reproduces_the_mask():
    layer = _Dropout().Instantiate()
    x, w = tf.constant(_Inputs(4, 16)), tf.constant(_Inputs(4, 16))
    remat = tf.recompute_grad(lambda x: layer(x))
    with seeds.StepSeedScope(5, 2):
        plain = _GradOfInputs(layer, x, w)
        recomputed = _GradOfInputs(remat, x, w)
        traced = tf.function(lambda: _GradOfInputs(remat, x, w))()
        mask = _Mask(layer, x)
    np.testing.assert_array_equal(recomputed.numpy(), plain.numpy())
    np.testing.assert_array_equal(traced.numpy(), plain.numpy())
    test_utils.AssertAllClose(plain, w.numpy() * mask / 0.5)

    # The backward must see the forward's scopes: taken outside them, the recompute
    # draws another mask (and a wrong gradient) unless the scopes are replayed.
    def Forward(x):
        with seeds.StepSeedScope(5, 2):
            return remat(x)

    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(Forward(x) * w)
    assert not np.array_equal(tape.gradient(loss, x).numpy(), plain.numpy())

    with seeds.StepSeedScope(5, 2):
        scope = seeds.CurrentScopeValues()

    def Replayed(x):
        with seeds.RestoreScopeValues(scope):
            return layer(x)

    np.testing.assert_array_equal(
        _GradOfInputs(tf.recompute_grad(Replayed), x, w).numpy(), plain.numpy()
    )


def test_meta_and_no_variables():
    p = _Dropout(keep_prob=0.9)
    with test_utils.CountVariables() as counter:
        meta = dropout.DropoutLayer.FPropMeta(p, [2, 3, 4])
        layer = p.Instantiate()
    assert counter.count == 0  # Dropout has no variables, built or not.
    assert meta.out_shapes == (tf.TensorShape([2, 3, 4]),)
    assert meta.flops == 3 * 24 and meta.num_params == 0
    assert dropout.DropoutLayer.FPropMeta(_Dropout(keep_prob=1.0), [2, 3]).flops == 0
    assert not layer.variables
    with pytest.raises(ValueError, match=r"dropout: FPropMeta needs every input dim known"):
        dropout.DropoutLayer.FPropMeta(p, [None, 3])


@pytest.mark.parametrize("keep_prob", [0, 0.0, 1.5, -0.5, True])
def test_bad_keep_prob(keep_prob):
    p = dropout.DropoutLayer.Params().Set(name="drop", keep_prob=1.0)
    p.keep_prob = keep_prob
    match = rf"drop: expected keep_prob in \(0, 1\], received keep_prob={keep_prob!r}"
    with pytest.raises(ValueError, match=match):
        p.Instantiate()
    with pytest.raises(ValueError, match=match):
        dropout.DropoutLayer.FPropMeta(p, [2, 3])


def test_bad_broadcast_dims_and_inputs():
    with pytest.raises(ValueError, match=r"drop: expected noise_shape_broadcast_dims to be None"):
        _Dropout(name="drop", noise_shape_broadcast_dims=[1.5]).Instantiate()
    with pytest.raises(ValueError, match=r"dropout: expected floating inputs, received.*int32"):
        _Dropout().Instantiate()(tf.constant([1, 2]))
