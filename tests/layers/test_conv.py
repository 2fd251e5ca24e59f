"""Tests of lingpipe.layers.conv against loop-based NumPy convolutions."""

import itertools
import math

import numpy as np
import pytest
import tensorflow as tf

from lingpipe import base_layer, test_utils
from lingpipe.layers import conv


def _PadSame(x, window, stride, dilation, padding):
    """x [b, h, w, c] padded as TensorFlow pads for `padding` (zeros, extra at the end)."""
    if padding == "VALID":
        return x
    pads = [(0, 0)]
    for size, k, s, d in zip(x.shape[1:3], window, stride, dilation):
        total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
        pads.append((total // 2, total - total // 2))
    return np.pad(x, pads + [(0, 0)])


def _NumpyWindows(x, window, stride, padding, dilation=(1, 1)):
    """Yields (i, j, di, dj, x[:, tap]) for every output position and filter tap."""
    x = _PadSame(x, window, stride, dilation, padding)
    (kh, kw), (sh, sw), (dh, dw) = window, stride, dilation
    oh = (x.shape[1] - (kh - 1) * dh - 1) // sh + 1
    ow = (x.shape[2] - (kw - 1) * dw - 1) // sw + 1
    for i, j, di, dj in itertools.product(range(oh), range(ow), range(kh), range(kw)):
        yield oh, ow, i, j, di, dj, x[:, i * sh + di * dh, j * sw + dj * dw, :]


def NumpyConv(x, w, stride, padding, dilation=(1, 1)):
    """Direct loop conv: x [b, h, w, in], w [kh, kw, in, out] -> [b, h', w', out]."""
    out = None
    for oh, ow, i, j, di, dj, tap in _NumpyWindows(x, w.shape[:2], stride, padding, dilation):
        if out is None:
            out = np.zeros([x.shape[0], oh, ow, w.shape[3]], np.float64)
        out[:, i, j, :] += tap @ w[di, dj]
    return out


def NumpyDepthwise(x, w, stride, padding, dilation=(1, 1)):
    """x [b, h, w, in], w [kh, kw, in, mult] -> [b, h', w', in * mult], channel c*mult+m."""
    b, cin, mult = x.shape[0], w.shape[2], w.shape[3]
    out = None
    for oh, ow, i, j, di, dj, tap in _NumpyWindows(x, w.shape[:2], stride, padding, dilation):
        if out is None:
            out = np.zeros([b, oh, ow, cin * mult], np.float64)
        out[:, i, j, :] += (tap[:, :, None] * w[di, dj]).reshape(b, cin * mult)
    return out


def _Conv(name="conv", **kwargs):
    p = conv.Conv2DLayer.Params().Set(name=name, filter_shape=(3, 3, 3, 4))
    return p.Set(**kwargs)


def _Depthwise(name="dw", **kwargs):
    p = conv.DepthwiseConv2DLayer.Params().Set(name=name, filter_shape=(3, 3, 3, 2))
    return p.Set(**kwargs)


def _Separable(name="sep", **kwargs):
    p = conv.SeparableConv2DLayer.Params().Set(name=name, filter_shape=(3, 3, 3, 4))
    return p.Set(depth_multiplier=2, **kwargs)


def _Inputs(shape=(2, 5, 6, 3)):
    return tf.constant(np.random.normal(size=shape), tf.float32)


def _RandomBias(layer):
    for v in layer.trainable_variables:
        if v.name.endswith("/b:0"):
            v.assign(np.random.normal(size=v.shape))


def _Weights(layer, name):
    return layer.vars.GetItem(name).numpy().astype(np.float64)


def test_numpy_conv_reference_agrees_with_tf_on_an_even_window():
    # The reference pads as TF does, also for even windows (extra padding at the end).
    x = np.random.normal(size=(1, 5, 4, 2))
    w = np.random.normal(size=(2, 4, 2, 3))
    expected = tf.nn.conv2d(x, w, strides=[1, 2, 1, 1], padding="SAME")
    test_utils.AssertAllClose(NumpyConv(x, w, (2, 1), "SAME"), expected, rtol=1e-10)


@pytest.mark.parametrize("kernel", [1, 3])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_conv_matches_numpy(kernel, stride, padding):
    layer = _Conv(
        filter_shape=(kernel, kernel, 3, 4), filter_stride=(stride, stride), padding=padding
    ).Instantiate()
    _RandomBias(layer)
    x = _Inputs()
    expected = NumpyConv(x.numpy(), _Weights(layer, "w"), (stride, stride), padding)
    expected += _Weights(layer, "b")
    test_utils.AssertAllClose(layer(x), expected)


def test_conv_dilation_activation_and_uneven_stride_match_numpy():
    x = _Inputs((2, 7, 6, 3))
    dilated = _Conv(dilation_rate=(2, 1), activation="RELU").Instantiate()
    _RandomBias(dilated)
    expected = NumpyConv(x.numpy(), _Weights(dilated, "w"), (1, 1), "SAME", (2, 1))
    expected = np.maximum(expected + _Weights(dilated, "b"), 0)
    test_utils.AssertAllClose(dilated(x), expected)
    strided = _Conv(filter_stride=(2, 1), padding="VALID", has_bias=False).Instantiate()
    expected = NumpyConv(x.numpy(), _Weights(strided, "w"), (2, 1), "VALID")
    test_utils.AssertAllClose(strided(x), expected)


def test_conv_computes_with_the_given_theta():
    layer = _Conv(filter_shape=(3, 3, 3, 2)).Instantiate()
    w = np.random.normal(size=(3, 3, 3, 2))
    theta = layer.theta.Transform(tf.identity)
    theta.w, theta.b = tf.constant(w, tf.float32), tf.constant([1.0, -1.0])
    x = _Inputs()
    expected = NumpyConv(x.numpy(), w, (1, 1), "SAME") + [1.0, -1.0]
    test_utils.AssertAllClose(layer.FProp(theta, x), expected)


@pytest.mark.parametrize("stride", [(1, 1), (2, 2), (2, 1)])
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_depthwise_matches_numpy(stride, padding):
    layer = _Depthwise(filter_stride=stride, padding=padding, has_bias=True).Instantiate()
    _RandomBias(layer)
    x = _Inputs()
    expected = NumpyDepthwise(x.numpy(), _Weights(layer, "w"), stride, padding)
    test_utils.AssertAllClose(layer(x), expected + _Weights(layer, "b"))
    assert layer(x).shape[-1] == 3 * 2


@pytest.mark.parametrize("stride,padding", [((1, 1), "SAME"), ((2, 2), "SAME"), ((2, 2), "VALID")])
def test_separable_matches_numpy(stride, padding):
    layer = _Separable(filter_stride=stride, padding=padding, activation="RELU").Instantiate()
    _RandomBias(layer)
    x = _Inputs()
    hidden = NumpyDepthwise(x.numpy(), _Weights(layer, "depthwise.w"), stride, padding)
    expected = NumpyConv(hidden, _Weights(layer, "pointwise.w"), (1, 1), "VALID")
    expected = np.maximum(expected + _Weights(layer, "pointwise.b"), 0)
    test_utils.AssertAllClose(layer(x), expected)


def test_separable_children():
    layer = _Separable(filter_stride=(2, 2)).Instantiate()
    assert isinstance(layer.depthwise, conv.DepthwiseConv2DLayer)
    assert isinstance(layer.pointwise, conv.Conv2DLayer)
    assert layer.depthwise.params.filter_shape == (3, 3, 3, 2)
    assert layer.depthwise.params.filter_stride == (2, 2)
    assert not layer.depthwise.params.has_bias
    assert layer.pointwise.params.filter_shape == (1, 1, 6, 4)


_ALL = [_Conv, _Depthwise, _Separable]


@pytest.mark.parametrize("make", _ALL)
def test_eager_equals_function_and_gradients_exist(make):
    layer = make(has_bias=True, activation="TANH").Instantiate()
    x = _Inputs()
    test_utils.AssertEagerEqualsFunction(layer, x)
    test_utils.AssertGradientsExist(layer, lambda: tf.reduce_sum(layer(x) ** 2))


def test_unknown_batch_and_spatial_dims_in_function():
    layer = _Conv(filter_stride=(2, 2)).Instantiate()
    fn = tf.function(layer, input_signature=[tf.TensorSpec([None, None, None, 3])])
    assert fn(_Inputs()).shape == (2, 3, 3, 4)
    meta = conv.Conv2DLayer.FPropMeta(layer.params, [None, None, 6, 3])
    assert meta.out_shapes[0].as_list() == [None, None, 3, 4]


@pytest.mark.parametrize("make", _ALL)
def test_checkpoint_round_trip(make, tmp_path):
    build = iter([1, 2])
    test_utils.CheckpointRoundTrip(
        lambda: make(random_seed=next(build)).Instantiate(), _Inputs(), str(tmp_path)
    )


def test_variable_names_follow_the_path():
    assert [v.name for v in _Conv().Instantiate().variables] == ["conv/b:0", "conv/w:0"]
    assert [v.name for v in _Depthwise().Instantiate().variables] == ["dw/w:0"]
    names = sorted(v.name for v in _Separable().Instantiate().variables)
    assert names == ["sep/depthwise/w:0", "sep/pointwise/b:0", "sep/pointwise/w:0"]
    assert _Conv().Instantiate().vars.w.shape == (3, 3, 3, 4)


@pytest.mark.parametrize("make", _ALL)
@pytest.mark.parametrize("has_bias", [False, True])
def test_meta_num_params_and_no_variables(make, has_bias):
    # These layers only have trainable variables.
    p = make(has_bias=has_bias)
    with test_utils.CountVariables() as counter:
        meta = p.cls.FPropMeta(p, [2, 5, 6, 3])
    assert counter.count == 0
    layer = p.Instantiate()
    assert not layer.non_trainable_variables
    assert meta.num_params == sum(int(np.prod(v.shape)) for v in layer.trainable_variables)
    assert meta.out_shapes[0] == layer(_Inputs()).shape


def test_meta_flops():
    p = _Conv(filter_stride=(2, 2), activation="RELU")  # output [2, 3, 3, 4]
    assert conv.Conv2DLayer.FPropMeta(p, [2, 5, 6, 3]).flops == 18 * (2 * 9 * 3 * 4 + 4 + 4)
    p = _Depthwise()  # output [2, 5, 6, 6]
    assert conv.DepthwiseConv2DLayer.FPropMeta(p, [2, 5, 6, 3]).flops == 60 * 2 * 9 * 3 * 2
    p = _Separable(has_bias=False)
    assert conv.SeparableConv2DLayer.FPropMeta(p, [2, 5, 6, 3]).flops == 60 * 2 * (54 + 24)


def test_meta_shapes_equal_real_shapes_over_a_grid():
    cases = itertools.product([1, 2, 3], [(1, 1), (2, 2), (3, 2)], ["SAME", "VALID"])
    for kernel, stride, padding in cases:
        for make, dilation in [(_Conv, (1, 1)), (_Conv, (2, 1)), (_Depthwise, (1, 1))]:
            if dilation != (1, 1) and stride != (1, 1):
                continue
            shape = (kernel, kernel + 1, 3, 2)
            p = make(filter_shape=shape, filter_stride=stride, padding=padding)
            p.dilation_rate = dilation
            for size in [(5, 6), (7, 4)]:
                x = _Inputs((1, *size, 3))
                real = p.Copy().Instantiate()(x).shape
                meta = p.cls.FPropMeta(p, x.shape).out_shapes[0]
                assert meta == real, (p.ToText(), size)
        p = _Separable(filter_shape=(kernel, 2, 3, 4), filter_stride=stride, padding=padding)
        x = _Inputs((1, 5, 6, 3))
        assert p.cls.FPropMeta(p, x.shape).out_shapes[0] == p.Instantiate()(x).shape


@pytest.mark.parametrize("make", _ALL)
@pytest.mark.parametrize(
    "filter_shape,match",
    [
        ((3, 3, 4), r"expected filter_shape to have 4 entries .*received filter_shape=\(3, 3, 4\)"),
        ((3, 0, 3, 4), r"expected filter_shape\[1\] to be a positive integer.*=0"),
        ((3, 3, 3, -1), r"expected filter_shape\[3\] to be a positive integer.*=-1"),
    ],
)
def test_bad_filter_shape(make, filter_shape, match):
    p = make(filter_shape=filter_shape)
    with pytest.raises(ValueError, match=match):
        p.Instantiate()
    with pytest.raises(ValueError, match=match):
        p.cls.FPropMeta(p, [2, 5, 6, 3])


@pytest.mark.parametrize("make", _ALL)
def test_bad_configs(make):
    with pytest.raises(ValueError, match=r"expected padding to be one of \['SAME', 'VALID'\]"):
        make(padding="FULL").Instantiate()
    with pytest.raises(ValueError, match=r"filter_stride\[0\] to be a positive integer"):
        make(filter_stride=(0, 1)).Instantiate()
    with pytest.raises(ValueError, match="expected filter_stride to have 2 entries"):
        make(filter_stride=2).Instantiate()
    with pytest.raises(ValueError, match="unknown activation 'softplus'; expected one of"):
        make(activation="softplus").Instantiate()
    with pytest.raises(ValueError, match=r"filter_stride or dilation_rate to be all ones"):
        make(filter_stride=(2, 2), dilation_rate=(1, 2)).Instantiate()
    with pytest.raises(ValueError, match="required param 'filter_shape' was not set"):
        make().Set(filter_shape=conv.hyperparams.REQUIRED).Instantiate()


def test_bad_depth_multiplier():
    with pytest.raises(ValueError, match="sep: expected depth_multiplier to be a positive integer"):
        _Separable().Set(depth_multiplier=0).Instantiate()


@pytest.mark.parametrize("make", _ALL)
def test_bad_inputs(make):
    layer = make().Instantiate()
    p = layer.params
    with pytest.raises(
        ValueError,
        match=r"expected inputs.shape\[-1\] == filter_shape\[2\], received "
        r"inputs.shape\[-1\]=5, filter_shape\[2\]=3",
    ):
        layer(_Inputs((2, 5, 6, 5)))
    with pytest.raises(ValueError, match=r"expected inputs.shape\[-1\] == filter_shape\[2\]"):
        p.cls.FPropMeta(p, [2, 5, 6, 5])
    for shape in [(2, 5, 3), (1, 2, 5, 6, 3)]:
        with pytest.raises(ValueError, match=r"expected inputs of rank 4 \[batch, height"):
            layer(_Inputs(shape))
        with pytest.raises(ValueError, match="expected inputs of rank 4"):
            p.cls.FPropMeta(p, shape)


def test_valid_window_larger_than_input():
    layer = _Conv(padding="VALID", filter_shape=(3, 5, 3, 4)).Instantiate()
    match = r"conv: expected inputs.shape\[2\] >= the effective window width.*inputs.shape\[2\]=4"
    with pytest.raises(ValueError, match=match):
        layer(_Inputs((1, 5, 4, 3)))
    with pytest.raises(ValueError, match=match):
        conv.Conv2DLayer.FPropMeta(layer.params, [1, 5, 4, 3])


def test_error_names_the_layer_path():
    class Parent(base_layer.BaseLayer):
        def __init__(self, params):
            super().__init__(params)
            self.CreateChild("conv", _Conv(filter_shape=(3, 3, 3, 0)))

    with pytest.raises(ValueError, match=r"^model/conv: expected filter_shape\[3\]"):
        Parent.Params().Set(name="model").Instantiate()
