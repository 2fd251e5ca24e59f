"""Tests of LinearLayer, BiasLayer and ProjectionLayer against NumPy references."""

import numpy as np
import pytest
import tensorflow as tf

from lingpipe import test_utils
from lingpipe.layers import linear
from lingpipe.nested_map import NestedMap


def _Linear(name="lin", input_dims=3, output_dims=4, **kwargs):
    return linear.LinearLayer.Params().Set(
        name=name, input_dims=input_dims, output_dims=output_dims, **kwargs
    )


def _Proj(name="fc", input_dims=3, output_dims=4, **kwargs):
    return linear.ProjectionLayer.Params().Set(
        name=name, input_dims=input_dims, output_dims=output_dims, **kwargs
    )


def _Inputs(*shape):
    return np.random.uniform(-1.0, 1.0, shape).astype(np.float32)


def _NumElements(variables):
    return sum(int(np.prod(v.shape)) for v in variables)


# ---- LinearLayer -------------------------------------------------------------


@pytest.mark.parametrize("shape", [(3,), (2, 3), (2, 5, 3)])
def test_linear_matches_numpy_any_rank(shape):
    layer = _Linear().Instantiate()
    x = _Inputs(*shape)
    expected = x @ layer.vars.w.numpy()
    out = test_utils.AssertEagerEqualsFunction(layer, x)
    assert out.shape == shape[:-1] + (4,)
    test_utils.AssertAllClose(out, expected)


def test_linear_uses_theta_not_vars():
    layer = _Linear().Instantiate()
    x = _Inputs(2, 3)
    w = np.random.normal(size=(3, 4)).astype(np.float32)
    out = layer.FProp(NestedMap(w=tf.constant(w)), x)
    test_utils.AssertAllClose(out, x @ w)


def test_linear_gradients_and_names():
    layer = _Linear().Instantiate()
    x = _Inputs(2, 3)
    test_utils.AssertGradientsExist(layer, lambda: tf.reduce_sum(layer(x) ** 2))
    assert [v.name for v in layer.variables] == ["lin/w:0"]
    assert layer.vars.w.shape == (3, 4)


def test_linear_meta():
    p = _Linear()
    with test_utils.CountVariables() as counter:
        meta = linear.LinearLayer.FPropMeta(p, [2, 5, 3])
    assert counter.count == 0
    assert meta.out_shapes == (tf.TensorShape([2, 5, 4]),)
    assert meta.flops == 2 * 10 * 3 * 4
    layer = p.Instantiate()
    assert meta.num_params == _NumElements(layer.trainable_variables) == 12


def test_linear_checkpoint_round_trip(tmp_path):
    # Different seeds give different weights, so only the restore can make outputs equal.
    w1 = _Linear(random_seed=1).Instantiate().vars.w.numpy()
    w2 = _Linear(random_seed=2).Instantiate().vars.w.numpy()
    assert not np.allclose(w1, w2)
    seeds = iter([1, 2])
    test_utils.CheckpointRoundTrip(
        lambda: _Linear(random_seed=next(seeds)).Instantiate(), _Inputs(2, 3), str(tmp_path)
    )


@pytest.mark.parametrize("field,value", [("input_dims", 0), ("output_dims", -2)])
def test_linear_bad_dims(field, value):
    with pytest.raises(
        ValueError,
        match=rf"lin: expected {field} to be a positive integer, "
        rf"received {field}={value}",
    ):
        _Linear(**{field: value}).Instantiate()
    with pytest.raises(ValueError, match=rf"expected {field} to be a positive integer"):
        linear.LinearLayer.FPropMeta(_Linear(**{field: value}), [2, 3])


def test_linear_input_dim_mismatch():
    layer = _Linear(input_dims=8).Instantiate()
    with pytest.raises(
        ValueError,
        match=r"lin: expected inputs.shape\[-1\] == input_dims, received "
        r"inputs.shape\[-1\]=6, input_dims=8",
    ):
        layer(_Inputs(2, 6))
    with pytest.raises(ValueError, match=r"expected input_shape\[-1\] == input_dims"):
        linear.LinearLayer.FPropMeta(_Linear(input_dims=8), [2, 6])
    with pytest.raises(ValueError, match=r"lin: expected inputs of rank >= 1"):
        layer(tf.constant(1.0))


# ---- BiasLayer ---------------------------------------------------------------


def test_bias_starts_at_zero_and_adds():
    layer = linear.BiasLayer.Params().Set(name="bias", dims=4).Instantiate()
    np.testing.assert_array_equal(layer.vars.b.numpy(), np.zeros([4], np.float32))
    b = np.random.normal(size=[4]).astype(np.float32)
    layer.vars.b.assign(b)
    x = _Inputs(2, 3, 4)
    out = test_utils.AssertEagerEqualsFunction(layer, x)
    test_utils.AssertAllClose(out, x + b)
    test_utils.AssertGradientsExist(layer, lambda: tf.reduce_sum(layer(x) ** 2))
    assert [v.name for v in layer.variables] == ["bias/b:0"]


def test_bias_meta_and_errors():
    p = linear.BiasLayer.Params().Set(name="bias", dims=4)
    with test_utils.CountVariables() as counter:
        meta = linear.BiasLayer.FPropMeta(p, tf.TensorShape([2, 3, 4]))
    assert counter.count == 0
    assert meta.out_shapes == (tf.TensorShape([2, 3, 4]),)
    assert meta.flops == 24
    assert meta.num_params == _NumElements(p.Instantiate().trainable_variables) == 4
    with pytest.raises(ValueError, match=r"bias: expected dims to be a positive integer"):
        p.Copy().Set(dims=0).Instantiate()
    with pytest.raises(ValueError, match=r"inputs.shape\[-1\]=5, dims=4"):
        p.Instantiate()(_Inputs(2, 5))


# ---- ProjectionLayer ---------------------------------------------------------


@pytest.mark.parametrize(
    "activation,fn",
    [
        ("RELU", lambda y: np.maximum(y, 0.0)),
        ("tanh", np.tanh),
        ("None", lambda y: y),
        ("Sigmoid", lambda y: 1.0 / (1.0 + np.exp(-y))),
    ],
)
def test_projection_matches_numpy(activation, fn):
    layer = _Proj(activation=activation, bias_init=0.5).Instantiate()
    np.testing.assert_array_equal(layer.vars.b.numpy(), np.full([4], 0.5, np.float32))
    b = np.random.normal(size=[4]).astype(np.float32)
    layer.vars.b.assign(b)
    x = _Inputs(2, 5, 3)
    expected = fn(x @ layer.vars.w.numpy() + b)
    out = test_utils.AssertEagerEqualsFunction(layer, x)
    test_utils.AssertAllClose(out, expected)


def test_projection_without_bias():
    layer = _Proj(activation="NONE", has_bias=False).Instantiate()
    assert sorted(layer.vars.keys()) == ["w"]
    x = _Inputs(3)
    test_utils.AssertAllClose(layer(x), x @ layer.vars.w.numpy())
    meta = linear.ProjectionLayer.FPropMeta(_Proj(activation="NONE", has_bias=False), [3])
    assert meta.out_shapes == (tf.TensorShape([4]),)
    assert meta.flops == 2 * 3 * 4
    assert meta.num_params == 12


def test_projection_gradients_and_names():
    # GELU: RELU's gradient would be zero (but not None) for negative pre-activations.
    layer = _Proj(activation="GELU").Instantiate()
    x = _Inputs(2, 3)
    test_utils.AssertGradientsExist(layer, lambda: tf.reduce_sum(layer(x)))
    assert sorted(v.name for v in layer.trainable_variables) == ["fc/b:0", "fc/w:0"]


def test_projection_meta():
    p = _Proj(activation="RELU")
    with test_utils.CountVariables() as counter:
        meta = linear.ProjectionLayer.FPropMeta(p, (2, 5, 3))
    assert counter.count == 0
    assert meta.out_shapes == (tf.TensorShape([2, 5, 4]),)
    # matmul 2*in*out per row, plus bias add and RELU (1 FLOP each) per output element.
    assert meta.flops == 10 * (2 * 3 * 4) + 10 * 4 * (1 + 1)
    layer = p.Instantiate()
    assert meta.num_params == _NumElements(layer.trainable_variables) == 3 * 4 + 4


def test_projection_meta_needs_known_rows():
    with pytest.raises(ValueError, match=r"fc: FPropMeta needs every input dim known"):
        linear.ProjectionLayer.FPropMeta(_Proj(), [None, 3])


def test_projection_checkpoint_round_trip(tmp_path):
    seeds = iter([3, 4])
    test_utils.CheckpointRoundTrip(
        lambda: _Proj(random_seed=next(seeds), bias_init=0.1).Instantiate(),
        _Inputs(2, 3),
        str(tmp_path),
    )


def test_projection_errors():
    with pytest.raises(
        ValueError,
        match=r"fc: expected input_dims to be a positive integer, "
        r"received input_dims=0",
    ):
        _Proj(input_dims=0).Instantiate()
    with pytest.raises(
        ValueError,
        match=r"fc: expected output_dims to be a positive integer, "
        r"received output_dims=-1",
    ):
        _Proj(output_dims=-1).Instantiate()
    with pytest.raises(ValueError, match=r"fc: unknown activation 'RELUX'; expected one of"):
        _Proj(activation="RELUX").Instantiate()
    with pytest.raises(ValueError, match=r"fc: unknown activation 'RELUX'"):
        linear.ProjectionLayer.FPropMeta(_Proj(activation="RELUX"), [2, 3])
    with pytest.raises(ValueError, match=r"fc: expected has_bias to be a bool, received 'yes'"):
        _Proj(has_bias="yes").Instantiate()
    with pytest.raises(
        ValueError,
        match=r"fc: expected inputs.shape\[-1\] == input_dims, received "
        r"inputs.shape\[-1\]=6, input_dims=3",
    ):
        _Proj().Instantiate()(_Inputs(2, 6))


def test_gradient_does_not_materialize_an_outer_product():
    # tf.einsum('...i,io->...o')'s weight gradient built a [batch, in, out] tensor:
    # 512 MiB here. A 2-D matmul needs a few MiB.
    layer = linear.ProjectionLayer.Params().Set(name="fc", input_dims=512, output_dims=512)
    layer = layer.Instantiate()
    x = tf.ones([512, 512])

    @tf.function
    def Step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x))
        return tape.gradient(loss, layer.trainable_variables)

    Step.get_concrete_function()
    tf.config.experimental.reset_memory_stats("CPU:0")
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    Step()
    step_bytes = tf.config.experimental.get_memory_info("CPU:0")["peak"] - before
    assert step_bytes < 64 * 2**20, f"one gradient step used {step_bytes / 2**20:.0f} MiB"
