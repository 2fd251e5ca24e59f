"""Tests of FeedForwardNet against a NumPy stack of its layers' weights."""

import numpy as np
import pytest
import tensorflow as tf

from lingpipe import test_utils
from lingpipe.layers import feedforward, linear

_NP_ACTS = {
    "RELU": lambda y: np.maximum(y, 0.0),
    "TANH": np.tanh,
    "NONE": lambda y: y,
}


def _Ffn(name="ffn", input_dims=3, hidden_layer_dims=(5, 4), **kwargs):
    return feedforward.FeedForwardNet.Params().Set(
        name=name, input_dims=input_dims, hidden_layer_dims=list(hidden_layer_dims), **kwargs
    )


def _Inputs(*shape):
    return np.random.uniform(-1.0, 1.0, shape).astype(np.float32)


def _NumElements(variables):
    return sum(int(np.prod(v.shape)) for v in variables)


def _NumpyFfn(layer, x, acts):
    """The reference: each fc's known weights, applied in order with NumPy."""
    out = x
    for fc_vars, act in zip(layer.vars.fc, acts):
        out = out @ fc_vars.w.numpy()
        if "b" in fc_vars:
            out = out + fc_vars.b.numpy()
        out = _NP_ACTS[act](out)
    return out


@pytest.mark.parametrize(
    "activation,acts",
    [("RELU", ["RELU", "RELU"]), (["tanh", "None"], ["TANH", "NONE"])],
)
def test_ffn_matches_numpy(activation, acts):
    layer = _Ffn(activation=activation).Instantiate()
    # Non-zero biases, so the reference checks that they are added.
    for fc_vars in layer.vars.fc:
        fc_vars.b.assign(np.random.normal(size=fc_vars.b.shape).astype(np.float32))
    x = _Inputs(2, 3, 3)
    out = test_utils.AssertEagerEqualsFunction(layer, x)
    assert out.shape == (2, 3, 4)
    test_utils.AssertAllClose(out, _NumpyFfn(layer, x, acts))


def test_ffn_children_and_names():
    layer = _Ffn(has_bias=[True, False]).Instantiate()
    assert len(layer.fc) == 2
    assert all(isinstance(c, linear.ProjectionLayer) for c in layer.fc)
    assert [c.path for c in layer.fc] == ["ffn/fc_0", "ffn/fc_1"]
    assert sorted(v.name for v in layer.trainable_variables) == [
        "ffn/fc_0/b:0",
        "ffn/fc_0/w:0",
        "ffn/fc_1/w:0",
    ]
    assert layer.vars.fc[0].w.shape == (3, 5)
    assert layer.vars.fc[1].w.shape == (5, 4)
    x = _Inputs(2, 3)
    test_utils.AssertAllClose(layer(x), _NumpyFfn(layer, x, ["RELU", "RELU"]))


def test_ffn_uses_theta():
    layer = _Ffn(activation="NONE").Instantiate()
    theta = tf.nest.map_structure(lambda v: 2.0 * tf.convert_to_tensor(v), layer.theta)
    x = _Inputs(2, 3)
    w0, b0 = 2.0 * layer.vars.fc[0].w.numpy(), 2.0 * layer.vars.fc[0].b.numpy()
    w1, b1 = 2.0 * layer.vars.fc[1].w.numpy(), 2.0 * layer.vars.fc[1].b.numpy()
    test_utils.AssertAllClose(layer.FProp(theta, x), (x @ w0 + b0) @ w1 + b1)


def test_ffn_gradients():
    layer = _Ffn(activation="GELU").Instantiate()
    x = _Inputs(2, 3)
    test_utils.AssertGradientsExist(layer, lambda: tf.reduce_sum(layer(x)))


def test_ffn_meta():
    p = _Ffn(activation=["RELU", "NONE"])
    with test_utils.CountVariables() as counter:
        meta = feedforward.FeedForwardNet.FPropMeta(p, [2, 7, 3])
    assert counter.count == 0
    assert meta.out_shapes == (tf.TensorShape([2, 7, 4]),)
    rows = 14
    # Per layer: 2*in*out per row, plus bias (1) and activation (RELU 1, NONE 0) per output.
    assert meta.flops == rows * (2 * 3 * 5 + 5 * 2) + rows * (2 * 5 * 4 + 4 * 1)
    layer = p.Instantiate()
    assert meta.num_params == _NumElements(layer.trainable_variables) == 3 * 5 + 5 + 5 * 4 + 4


def test_ffn_checkpoint_round_trip(tmp_path):
    seeds = iter([5, 6])
    test_utils.CheckpointRoundTrip(
        lambda: _Ffn(random_seed=next(seeds)).Instantiate(), _Inputs(2, 3), str(tmp_path)
    )


def test_ffn_children_inherit_random_seed():
    a = _Ffn(random_seed=5).Instantiate().vars.fc[0].w.numpy()
    b = _Ffn(random_seed=6).Instantiate().vars.fc[0].w.numpy()
    assert not np.allclose(a, b)


def test_ffn_bad_dims():
    with pytest.raises(
        ValueError,
        match=r"ffn: expected input_dims to be a positive integer, received input_dims=0",
    ):
        _Ffn(input_dims=0).Instantiate()
    with pytest.raises(
        ValueError,
        match=r"ffn: expected hidden_layer_dims\[1\] to be a positive integer, "
        r"received hidden_layer_dims\[1\]=-4",
    ):
        _Ffn(hidden_layer_dims=[5, -4]).Instantiate()
    with pytest.raises(
        ValueError,
        match=r"ffn: expected hidden_layer_dims to be a non-empty list.*"
        r"received hidden_layer_dims=\[\]",
    ):
        _Ffn(hidden_layer_dims=[]).Instantiate()
    with pytest.raises(ValueError, match=r"non-empty list"):
        feedforward.FeedForwardNet.FPropMeta(_Ffn(hidden_layer_dims=[]), [2, 3])


def test_ffn_bad_activation():
    with pytest.raises(ValueError, match=r"ffn/fc_1: unknown activation 'RELUX'"):
        _Ffn(activation=["RELU", "RELUX"]).Instantiate()
    with pytest.raises(ValueError, match=r"ffn/fc_0: unknown activation 'bogus'"):
        _Ffn(activation="bogus").Instantiate()
    with pytest.raises(
        ValueError,
        match=r"ffn: expected len\(activation\) == len\(hidden_layer_dims\), received "
        r"len\(activation\)=3 .*len\(hidden_layer_dims\)=2",
    ):
        _Ffn(activation=["RELU", "RELU", "TANH"]).Instantiate()
    with pytest.raises(ValueError, match=r"len\(has_bias\)=1"):
        _Ffn(has_bias=[True]).Instantiate()


def test_ffn_input_dim_mismatch():
    layer = _Ffn(input_dims=8).Instantiate()
    with pytest.raises(
        ValueError,
        match=r"ffn: expected inputs.shape\[-1\] == input_dims, received "
        r"inputs.shape\[-1\]=6, input_dims=8",
    ):
        layer(_Inputs(2, 6))
    with pytest.raises(ValueError, match=r"ffn: expected input_shape\[-1\] == input_dims"):
        feedforward.FeedForwardNet.FPropMeta(_Ffn(input_dims=8), [2, 6])
