"""Tests of LayerNorm and BatchNormLayer (with micro-batch statistics) against NumPy."""

import numpy as np
import pytest
import tensorflow as tf

from lingpipe import base_layer, test_utils
from lingpipe.layers import normalization
from lingpipe.nested_map import NestedMap


def _Ln(name="ln", input_dims=4, **kwargs):
    return normalization.LayerNorm.Params().Set(name=name, input_dims=input_dims, **kwargs)


def _Bn(name="bn", dim=3, **kwargs):
    return normalization.BatchNormLayer.Params().Set(name=name, dim=dim, **kwargs)


def _Inputs(*shape, offset=0.0):
    return (offset + np.random.normal(size=shape)).astype(np.float32)


def _NumElements(variables):
    return sum(int(np.prod(v.shape)) for v in variables)


def _Randomize(layer, names):
    for name in names:
        var = layer.vars[name]
        var.assign(np.random.uniform(0.5, 1.5, var.shape).astype(np.float32))


def _BnRef(x, mean, var, gamma, beta, eps):
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def _Moments(x, weights=None):
    """float64 moments over every axis but the last, weighted by `weights` [..., 1]."""
    x = x.astype(np.float64).reshape(-1, x.shape[-1])
    w = np.ones((x.shape[0], 1)) if weights is None else weights.reshape(-1, 1).astype(np.float64)
    mean = (w * x).sum(0) / w.sum()
    return w.sum(), mean, (w * (x - mean) ** 2).sum(0) / w.sum()


# ---- LayerNorm ---------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4,), (2, 4), (2, 3, 4)])
def test_layer_norm_matches_numpy(shape):
    layer = _Ln().Instantiate()
    _Randomize(layer, ["scale", "bias"])
    x = _Inputs(*shape, offset=5.0)
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    scale, bias = layer.vars.scale.numpy(), layer.vars.bias.numpy()
    expected = (x - mean) / np.sqrt(var + 1e-6) * scale + bias
    out = test_utils.AssertEagerEqualsFunction(layer, x)
    test_utils.AssertAllClose(out, expected, rtol=1e-5, atol=1e-5)


def test_layer_norm_initial_values_theta_and_names():
    layer = _Ln().Instantiate()
    np.testing.assert_array_equal(layer.vars.scale.numpy(), np.ones(4))
    np.testing.assert_array_equal(layer.vars.bias.numpy(), np.zeros(4))
    assert [v.name for v in layer.trainable_variables] == ["ln/bias:0", "ln/scale:0"]
    x = _Inputs(2, 4)
    theta = NestedMap(scale=tf.fill([4], 2.0), bias=tf.fill([4], 1.0))
    normalized = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-6)
    test_utils.AssertAllClose(layer.FProp(theta, x), 2.0 * normalized + 1.0, atol=1e-5)
    test_utils.AssertGradientsExist(layer, lambda: tf.reduce_sum(layer(x) * x))


def test_layer_norm_meta_and_checkpoint(tmp_path):
    p = _Ln()
    with test_utils.CountVariables() as counter:
        meta = normalization.LayerNorm.FPropMeta(p, [2, 3, 4])
    assert counter.count == 0
    assert meta.out_shapes == (tf.TensorShape([2, 3, 4]),)
    assert meta.flops == 8 * 24
    assert meta.num_params == _NumElements(p.Instantiate().trainable_variables) == 8

    def Build():
        layer = _Ln().Instantiate()
        _Randomize(layer, ["scale", "bias"])  # Each build differs until restored.
        return layer

    test_utils.CheckpointRoundTrip(Build, _Inputs(2, 4), str(tmp_path))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(input_dims=0), r"ln: expected input_dims to be a positive integer.*input_dims=0"),
        (dict(input_dims=-2), r"input_dims=-2"),
        (dict(epsilon=0.0), r"ln: expected epsilon > 0, received epsilon=0.0"),
    ],
)
def test_layer_norm_bad_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _Ln(**kwargs).Instantiate()
    with pytest.raises(ValueError, match=match):
        normalization.LayerNorm.FPropMeta(_Ln(**kwargs), [2, 4])


def test_layer_norm_input_mismatch():
    layer = _Ln(input_dims=8).Instantiate()
    with pytest.raises(
        ValueError,
        match=r"ln: expected inputs.shape\[-1\] == input_dims, received inputs.shape\[-1\]=6, "
        r"input_dims=8",
    ):
        layer(_Inputs(2, 6))
    with pytest.raises(ValueError, match=r"input_shape\[-1\]=6, input_dims=8"):
        normalization.LayerNorm.FPropMeta(_Ln(input_dims=8), [2, 6])


# ---- BatchNormLayer: plain use -----------------------------------------------


@pytest.mark.parametrize("shape", [(6, 3), (2, 3, 2, 3)])  # [b, d] and NHWC.
def test_batch_norm_training_and_one_update(shape):
    layer = _Bn(decay=0.9).Instantiate()
    _Randomize(layer, ["gamma", "beta"])
    x = _Inputs(*shape, offset=2.0)
    _, mean, var = _Moments(x)
    gamma, beta = layer.vars.gamma.numpy(), layer.vars.beta.numpy()
    out = layer(x)
    test_utils.AssertAllClose(out, _BnRef(x, mean, var, gamma, beta, 1e-3), atol=1e-5)
    test_utils.AssertAllClose(layer.vars.moving_mean, 0.1 * mean)
    test_utils.AssertAllClose(layer.vars.moving_variance, 0.9 + 0.1 * var)


def test_batch_norm_eval_uses_moving_stats():
    layer = _Bn().Instantiate()
    _Randomize(layer, ["gamma", "beta", "moving_mean", "moving_variance"])
    v = {k: layer.vars[k].numpy() for k in ["gamma", "beta", "moving_mean", "moving_variance"]}
    x = _Inputs(2, 2, 3)
    expected = _BnRef(x, v["moving_mean"], v["moving_variance"], v["gamma"], v["beta"], 1e-3)
    with base_layer.EvalMode():
        out = test_utils.AssertEagerEqualsFunction(layer, x)
    test_utils.AssertAllClose(out, expected)
    test_utils.AssertAllClose(layer.vars.moving_mean, v["moving_mean"], rtol=0, atol=0)


@pytest.mark.parametrize("form", ["exact", "lingvo", "broadcast"])
def test_batch_norm_paddings_excluded_from_moments(form):
    layer = _Bn(decay=0.0).Instantiate()
    x = _Inputs(3, 4, 3)
    pad = np.zeros((3, 4), np.float32)
    pad[0, 2:] = 1.0
    pad[2, 1:] = 1.0
    if form == "lingvo":
        paddings = pad[..., None]
    elif form == "broadcast":  # [batch, 1]: whole sequences padded.
        pad = np.array([[0.0], [1.0], [0.0]], np.float32) * np.ones((1, 4), np.float32)
        paddings = pad[:, :1]
    else:
        paddings = pad
    x[pad > 0] = 1e4  # Would dominate the moments if counted.
    _, mean, var = _Moments(x, 1.0 - pad)
    out = layer(x, paddings)
    keep = pad == 0
    test_utils.AssertAllClose(out.numpy()[keep], _BnRef(x, mean, var, 1.0, 0.0, 1e-3)[keep])
    test_utils.AssertAllClose(layer.vars.moving_mean, mean)
    test_utils.AssertAllClose(layer.vars.moving_variance, var)


def test_batch_norm_all_padded_leaves_moving_averages():
    layer = _Bn(decay=0.5).Instantiate()
    layer(_Inputs(2, 3), np.ones([2], np.float32))
    np.testing.assert_array_equal(layer.vars.moving_mean.numpy(), np.zeros(3))
    np.testing.assert_array_equal(layer.vars.moving_variance.numpy(), np.ones(3))


def test_batch_norm_function_gradients_names_meta(tmp_path):
    p = _Bn()
    layer = p.Instantiate()
    x = _Inputs(4, 3)
    test_utils.AssertEagerEqualsFunction(layer, x)
    test_utils.AssertGradientsExist(layer, lambda: tf.reduce_sum(layer(x) * x))
    assert sorted(v.name for v in layer.trainable_variables) == ["bn/beta:0", "bn/gamma:0"]
    assert sorted(v.name for v in layer.non_trainable_variables) == [
        "bn/moving_mean:0",
        "bn/moving_variance:0",
    ]
    with test_utils.CountVariables() as counter:
        meta = normalization.BatchNormLayer.FPropMeta(p, [2, 5, 3], [2, 5])
    assert counter.count == 0
    assert meta.out_shapes == (tf.TensorShape([2, 5, 3]),)
    # num_params counts trainable AND non-trainable (moving statistics) variables.
    assert meta.num_params == _NumElements(layer.variables) == 12
    assert _NumElements(layer.trainable_variables) == 6


def test_batch_norm_checkpoint_round_trip(tmp_path):
    def Build():
        layer = _Bn().Instantiate()
        _Randomize(layer, ["gamma", "beta", "moving_mean", "moving_variance"])
        return layer

    with base_layer.EvalMode():  # Eval output reads all four variables.
        test_utils.CheckpointRoundTrip(Build, _Inputs(2, 3), str(tmp_path))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(dim=0), r"bn: expected dim to be a positive integer, received dim=0"),
        (dict(decay=1.5), r"bn: expected 0 <= decay <= 1, received decay=1.5"),
        (dict(decay=-0.1), r"received decay=-0.1"),
        (dict(epsilon=-1.0), r"bn: expected epsilon > 0, received epsilon=-1.0"),
    ],
)
def test_batch_norm_bad_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _Bn(**kwargs).Instantiate()
    with pytest.raises(ValueError, match=match):
        normalization.BatchNormLayer.FPropMeta(_Bn(**kwargs), [2, 3])


def test_batch_norm_bad_inputs():
    layer = _Bn().Instantiate()
    with pytest.raises(ValueError, match=r"bn: expected inputs.shape\[-1\] == dim.*=4, dim=3"):
        layer(_Inputs(2, 4))
    with pytest.raises(ValueError, match=r"bn: expected inputs of rank >= 2"):
        layer(_Inputs(3))
    with pytest.raises(ValueError, match=r"bn: expected paddings of shape.*\[2, 5\].*\(3,\)"):
        layer(_Inputs(2, 5, 3), np.zeros([3], np.float32))


# ---- BatchNormLayer: statistics contexts -------------------------------------

_SIZES = [3, 3, 2, 2]


def _MicroBatchStep(layer, x, paddings=None):
    """Runs `layer` on uneven micro-batches of x inside BatchNormStats, then Apply()."""
    pads = [None] * 4 if paddings is None else np.split(paddings, np.cumsum(_SIZES)[:-1])
    with normalization.BatchNormStats() as stats:
        for mb, pad in zip(np.split(x, np.cumsum(_SIZES)[:-1]), pads):
            layer(mb, pad)
        mean, var = stats.Combined(layer)
        assert stats.NumRecords(layer) == 4
        stats.Apply()
    return mean, var


@pytest.mark.parametrize("decay", [0.99, 0.0])
def test_batch_norm_stats_micro_batches_equal_full_batch(decay):
    x = _Inputs(10, 3, offset=1000.0)  # A large mean: a naive E[x^2] - E[x]^2 fails here.
    full = _Bn(decay=decay).Instantiate()
    full(x)
    layer = _Bn(decay=decay).Instantiate()
    with normalization.BatchNormStats() as stats:
        for mb in np.split(x, np.cumsum(_SIZES)[:-1]):
            layer(mb)
        # Recording does not touch the moving averages.
        np.testing.assert_array_equal(layer.vars.moving_mean.numpy(), np.zeros(3))
        _, mean, var = _Moments(x)
        test_utils.AssertAllClose(stats.Combined(layer), (mean, var))
        updates = stats.Apply()
    assert len(updates) == 2
    test_utils.AssertAllClose(layer.vars.moving_mean, full.vars.moving_mean)
    test_utils.AssertAllClose(layer.vars.moving_variance, full.vars.moving_variance)
    # Exactly once: one more update would move them again.
    test_utils.AssertAllClose(layer.vars.moving_mean, (1 - decay) * mean)
    test_utils.AssertAllClose(layer.vars.moving_variance, decay + (1 - decay) * var)


def test_batch_norm_stats_with_paddings_and_empty_micro_batch():
    x = _Inputs(10, 2, 3)
    pad = np.zeros((10, 2), np.float32)
    pad[3:6, 1] = 1.0
    pad[6:8] = 1.0  # The third micro-batch is all padding: count 0, weight 0.
    _, mean, var = _Moments(x, 1.0 - pad)
    got = _MicroBatchStep(_Bn().Instantiate(), x, pad)
    test_utils.AssertAllClose(got, (mean, var))


def test_batch_norm_suspend_and_nesting():
    layer = _Bn().Instantiate()
    x = _Inputs(4, 3)
    with normalization.SuspendBatchNormUpdates():
        layer(x)
    np.testing.assert_array_equal(layer.vars.moving_mean.numpy(), np.zeros(3))
    np.testing.assert_array_equal(layer.vars.moving_variance.numpy(), np.ones(3))
    with normalization.BatchNormStats() as stats:
        with normalization.SuspendBatchNormUpdates():  # Innermost wins: no record.
            layer(x)
        assert stats.NumRecords(layer) == 0
        assert stats.Apply() == []  # No records: a no-op.
    with normalization.SuspendBatchNormUpdates():
        with normalization.BatchNormStats() as stats:  # Innermost wins: records.
            layer(x)
        assert stats.NumRecords(layer) == 1 and stats.layers == [layer]
    np.testing.assert_array_equal(layer.vars.moving_mean.numpy(), np.zeros(3))
    layer(x)  # No context any more: a plain update.
    assert not np.allclose(layer.vars.moving_mean.numpy(), 0.0)


def test_batch_norm_stats_in_function():
    x = _Inputs(10, 3, offset=1000.0)
    eager = _Bn(decay=0.5).Instantiate()
    traced = _Bn(decay=0.5).Instantiate()
    suspended = _Bn(decay=0.5).Instantiate()
    _MicroBatchStep(eager, x)

    @tf.function
    def Step(x):
        with normalization.BatchNormStats() as stats:
            for mb in tf.split(x, _SIZES):
                traced(mb)
            with normalization.SuspendBatchNormUpdates():
                traced(x)  # A recompute: must not count.
                suspended(x)
            stats.Apply()

    Step(tf.constant(x))
    for name in ["moving_mean", "moving_variance"]:
        test_utils.AssertAllClose(traced.vars[name], eager.vars[name])
    np.testing.assert_array_equal(suspended.vars.moving_mean.numpy(), np.zeros(3))

    plain = _Bn(decay=0.5).Instantiate()
    tf.function(lambda x: plain(x))(tf.constant(x))  # No context: updated once per call.
    test_utils.AssertAllClose(plain.vars.moving_mean, 0.5 * _Moments(x)[1])


def test_batch_norm_stats_errors_and_stop_gradient():
    layer = _Bn().Instantiate()
    other = _Bn(name="other").Instantiate()
    x = tf.constant(_Inputs(4, 3))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        with normalization.BatchNormStats() as stats:
            y = layer(x)
        mean, _ = stats.Combined(layer)
    assert tape.gradient(mean, x) is None
    assert tape.gradient(y, x) is not None
    with pytest.raises(ValueError, match=r"other: no batch statistics were recorded"):
        stats.Combined(other)
    stats.Apply()
    with pytest.raises(ValueError, match=r"Apply\(\) was already called"):
        stats.Apply()
    with pytest.raises(ValueError, match=r"bn: batch statistics recorded after .*Apply"):
        with stats:
            layer(x)
