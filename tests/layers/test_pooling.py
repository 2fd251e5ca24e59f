"""Tests of lingpipe.layers.pooling against loop-based NumPy pooling.

The pooling layers have no variables, so there is no gradient-per-variable or
checkpoint test: gradients are checked with respect to the inputs instead.
"""

import itertools
import math

import numpy as np
import pytest
import tensorflow as tf

from lingpipe import test_utils
from lingpipe.layers import pooling


def NumpyPool(x, window, stride, padding, pooling_type):
    """x [b, h, w, c] -> [b, h', w', c]; SAME pads with NaN, which both reductions skip."""
    if padding == "SAME":
        pads = [(0, 0)]
        for size, k, s in zip(x.shape[1:3], window, stride):
            total = max((math.ceil(size / s) - 1) * s + k - size, 0)
            pads.append((total // 2, total - total // 2))
        x = np.pad(x, pads + [(0, 0)], constant_values=np.nan)
    (kh, kw), (sh, sw) = window, stride
    oh, ow = (x.shape[1] - kh) // sh + 1, (x.shape[2] - kw) // sw + 1
    reduce = np.nanmax if pooling_type == "MAX" else np.nanmean
    out = np.zeros([x.shape[0], oh, ow, x.shape[3]])
    for i, j in itertools.product(range(oh), range(ow)):
        out[:, i, j, :] = reduce(x[:, i * sh : i * sh + kh, j * sw : j * sw + kw, :], axis=(1, 2))
    return out


def _Pool(**kwargs):
    return pooling.Pooling2DLayer.Params().Set(name="pool", **kwargs)


def _Global(**kwargs):
    return pooling.GlobalPoolingLayer.Params().Set(name="gpool", **kwargs)


def _Inputs(shape=(2, 5, 6, 3)):
    return tf.constant(np.random.normal(size=shape), tf.float32)


@pytest.mark.parametrize("pooling_type", ["MAX", "AVG"])
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
@pytest.mark.parametrize(
    "window,stride", [((2, 2), (2, 2)), ((3, 3), (1, 1)), ((3, 3), (2, 2)), ((3, 2), (2, 1))]
)
def test_pooling_matches_numpy(pooling_type, padding, window, stride):
    p = _Pool(window_shape=window, window_stride=stride, pooling_type=pooling_type)
    layer = p.Set(padding=padding).Instantiate()
    x = _Inputs()
    test_utils.AssertAllClose(layer(x), NumpyPool(x.numpy(), window, stride, padding, pooling_type))


def test_avg_same_excludes_padding():
    # A corner window of a 3x3 SAME pooling over ones sees only 4 real values: the mean is 1.
    layer = _Pool(window_shape=(3, 3), window_stride=(1, 1), pooling_type="AVG").Instantiate()
    test_utils.AssertAllClose(layer(tf.ones([1, 3, 3, 1])), np.ones([1, 3, 3, 1]))


def test_defaults():
    p = pooling.Pooling2DLayer.Params()
    assert (p.window_shape, p.window_stride, p.pooling_type) == ((2, 2), (2, 2), "MAX")
    p = pooling.GlobalPoolingLayer.Params()
    assert (p.pooling_type, p.keepdims) == ("AVG", False)


@pytest.mark.parametrize("pooling_type", ["MAX", "AVG"])
@pytest.mark.parametrize("keepdims", [False, True])
def test_global_pooling_matches_numpy(pooling_type, keepdims):
    layer = _Global(pooling_type=pooling_type, keepdims=keepdims).Instantiate()
    x = _Inputs()
    reduce = np.max if pooling_type == "MAX" else np.mean
    expected = reduce(x.numpy(), axis=(1, 2), keepdims=keepdims)
    test_utils.AssertAllClose(layer(x), expected)
    assert layer(x).shape == ((2, 1, 1, 3) if keepdims else (2, 3))


@pytest.mark.parametrize(
    "p", [_Pool(pooling_type="AVG"), _Pool(), _Global(), _Global(keepdims=True)]
)
def test_eager_equals_function_and_input_gradients(p):
    layer = p.Instantiate()
    x = _Inputs()
    test_utils.AssertEagerEqualsFunction(layer, x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(layer(x))
    grad = tape.gradient(loss, x)
    assert grad is not None and np.any(grad.numpy() != 0)


@pytest.mark.parametrize("p", [_Pool(), _Global()])
def test_no_variables_and_meta_builds_nothing(p):
    with test_utils.CountVariables() as counter:
        meta = p.cls.FPropMeta(p, [2, 5, 6, 3])
        layer = p.Instantiate()
    assert counter.count == 0
    assert meta.num_params == 0 and not layer.variables


def test_meta_flops_and_unknown_dims():
    meta = pooling.Pooling2DLayer.FPropMeta(_Pool(), [2, 5, 6, 3])
    assert meta.out_shapes[0].as_list() == [2, 3, 3, 3]
    assert meta.flops == 2 * 3 * 3 * 3 * 4
    meta = pooling.GlobalPoolingLayer.FPropMeta(_Global(), [2, 5, 6, 3])
    assert meta.out_shapes[0].as_list() == [2, 3] and meta.flops == 2 * 5 * 6 * 3
    meta = pooling.Pooling2DLayer.FPropMeta(_Pool(), [None, 7, None, 3])
    assert meta.out_shapes[0].as_list() == [None, 4, None, 3]
    fn = tf.function(_Pool().Instantiate(), input_signature=[tf.TensorSpec([None, None, None, 3])])
    assert fn(_Inputs()).shape == (2, 3, 3, 3)


def test_meta_shapes_equal_real_shapes_over_a_grid():
    windows = [(1, 1), (2, 2), (3, 2)]
    strides = [(1, 1), (2, 2), (3, 1)]
    for window, stride, padding, size in itertools.product(
        windows, strides, ["SAME", "VALID"], [(5, 6), (4, 7)]
    ):
        p = _Pool(window_shape=window, window_stride=stride, padding=padding)
        x = _Inputs((1, *size, 2))
        meta = pooling.Pooling2DLayer.FPropMeta(p, x.shape).out_shapes[0]
        assert meta == p.Instantiate()(x).shape, (window, stride, padding, size)
    for keepdims in [False, True]:
        p = _Global(keepdims=keepdims)
        x = _Inputs()
        assert p.cls.FPropMeta(p, x.shape).out_shapes[0] == p.Instantiate()(x).shape


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"window_shape": (2, 2, 2)}, r"expected window_shape to have 2 entries \(height, width\)"),
        ({"window_shape": (0, 2)}, r"expected window_shape\[0\] to be a positive integer.*=0"),
        ({"window_stride": (2, -1)}, r"expected window_stride\[1\] to be a positive integer"),
        ({"padding": "same"}, r"expected padding to be one of \['SAME', 'VALID'\].*'same'"),
        ({"pooling_type": "MIN"}, r"pool: expected pooling_type to be one of \['MAX', 'AVG'\]"),
    ],
)
def test_bad_pooling_configs(kwargs, match):
    p = _Pool(**kwargs)
    with pytest.raises(ValueError, match=match):
        p.Instantiate()
    with pytest.raises(ValueError, match=match):
        pooling.Pooling2DLayer.FPropMeta(p, [2, 5, 6, 3])


def test_bad_global_pooling_type():
    match = r"gpool: expected pooling_type to be one of \['MAX', 'AVG'\], received .*'SUM'"
    with pytest.raises(ValueError, match=match):
        _Global(pooling_type="SUM").Instantiate()
    with pytest.raises(ValueError, match=match):
        pooling.GlobalPoolingLayer.FPropMeta(_Global(pooling_type="SUM"), [2, 5, 6, 3])


@pytest.mark.parametrize("p", [_Pool(), _Global()])
@pytest.mark.parametrize("shape", [(2, 6, 3), (1, 2, 5, 6, 3)])
def test_bad_input_rank(p, shape):
    match = r"expected inputs of rank 4 \[batch, height, width, channels\], received"
    with pytest.raises(ValueError, match=match):
        p.Instantiate()(_Inputs(shape))
    with pytest.raises(ValueError, match=match):
        p.cls.FPropMeta(p, shape)


def test_valid_window_larger_than_input():
    p = _Pool(window_shape=(3, 3), padding="VALID")
    match = r"pool: expected inputs.shape\[1\] >= the effective window height"
    with pytest.raises(ValueError, match=match):
        p.Instantiate()(_Inputs((1, 2, 6, 3)))
    with pytest.raises(ValueError, match=match):
        pooling.Pooling2DLayer.FPropMeta(p, [1, 2, 6, 3])
