"""Tests of SequentialLayer and RepeatLayer, with small layers defined here."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import tensorflow as tf

from lingpipe import base_layer, test_utils
from lingpipe.layers import sequential
from lingpipe.nested_map import NestedMap

_GAUSS = base_layer.WeightInit.Gaussian(1.0)


class Scale(base_layer.BaseLayer):
    """inputs * w, w: [dims]."""

    @classmethod
    def Params(cls):
        p = super().Params()
        p.Define("dims", 3, "Last dim of the inputs.")
        return p

    def __init__(self, params):
        super().__init__(params)
        self.CreateVariable("w", base_layer.WeightParams([self.params.dims], init=_GAUSS))

    def FProp(self, theta, inputs):
        return inputs * theta.w

    @classmethod
    def FPropMeta(cls, p, input_shape):
        shape = base_layer.ToShape(input_shape)
        return base_layer.Meta(shape, shape.num_elements(), p.dims)


class AddOne(base_layer.BaseLayer):
    """inputs + 1; no variables."""

    def FProp(self, theta, inputs):
        return inputs + 1.0

    @classmethod
    def FPropMeta(cls, p, input_shape):
        shape = base_layer.ToShape(input_shape)
        return base_layer.Meta(shape, shape.num_elements(), 0)


class Dense(base_layer.BaseLayer):
    """inputs @ w, w: [input_dims, output_dims]."""

    @classmethod
    def Params(cls):
        p = super().Params()
        p.Define("input_dims", 3, "Input dims.")
        p.Define("output_dims", 3, "Output dims.")
        return p

    def __init__(self, params):
        super().__init__(params)
        p = self.params
        self.CreateVariable("w", base_layer.WeightParams([p.input_dims, p.output_dims]))

    def FProp(self, theta, inputs):
        return tf.matmul(inputs, theta.w)

    @classmethod
    def FPropMeta(cls, p, input_shape):
        shape = base_layer.ToShape(input_shape)
        rows = shape[:-1].num_elements()
        return base_layer.Meta(
            shape[:-1].concatenate([p.output_dims]),
            2 * rows * p.input_dims * p.output_dims,
            p.input_dims * p.output_dims,
        )


class Fork(base_layer.BaseLayer):
    """Returns a tuple (inputs * w, inputs + 1)."""

    def __init__(self, params):
        super().__init__(params)
        self.CreateVariable("w", base_layer.WeightParams([3], init=_GAUSS))

    def FProp(self, theta, inputs):
        return inputs * theta.w, inputs + 1.0

    @classmethod
    def FPropMeta(cls, p, input_shape):
        shape = base_layer.ToShape(input_shape)
        return base_layer.Meta((shape, shape), shape.num_elements() * 2, 3)


class Join(base_layer.BaseLayer):
    """Takes two positional args: a + b * w."""

    def __init__(self, params):
        super().__init__(params)
        self.CreateVariable("w", base_layer.WeightParams([3], init=_GAUSS))

    def FProp(self, theta, a, b):
        return a + b * theta.w

    @classmethod
    def FPropMeta(cls, p, a_shape, b_shape):
        shape = base_layer.ToShape(a_shape)
        if shape != base_layer.ToShape(b_shape):
            raise ValueError(f"{p.name}: a and b shapes differ")
        return base_layer.Meta(shape, shape.num_elements() * 2, 3)


class ToMap(base_layer.BaseLayer):
    """Returns NestedMap(x=inputs, y=2 * inputs)."""

    def FProp(self, theta, inputs):
        return NestedMap(x=inputs, y=2.0 * inputs)

    @classmethod
    def FPropMeta(cls, p, input_shape):
        shape = base_layer.ToShape(input_shape)
        return base_layer.Meta(NestedMap(x=shape, y=shape), shape.num_elements(), 0)


class MapScale(base_layer.BaseLayer):
    """NestedMap in, NestedMap out: x * w, y unchanged."""

    def __init__(self, params):
        super().__init__(params)
        self.CreateVariable("w", base_layer.WeightParams([3], init=_GAUSS))

    def FProp(self, theta, m):
        return NestedMap(x=m.x * theta.w, y=m.y)

    @classmethod
    def FPropMeta(cls, p, m):
        return base_layer.Meta(NestedMap(x=m.x, y=m.y), m.x.num_elements(), 3)


class FromMap(base_layer.BaseLayer):
    """NestedMap in: x + y."""

    def FProp(self, theta, m):
        return m.x + m.y

    @classmethod
    def FPropMeta(cls, p, m):
        return base_layer.Meta(base_layer.ToShape(m.x), m.x.num_elements(), 0)


def _Seq(name="seq", sub=None, **kwargs):
    if sub is None:
        sub = [Scale.Params(), AddOne.Params(), Dense.Params().Set(output_dims=4)]
    return sequential.SequentialLayer.Params().Set(name=name, sub=sub, **kwargs)


def _Rep(name="rep", body=None, repeat=3, **kwargs):
    body = body if body is not None else Dense.Params()
    return sequential.RepeatLayer.Params().Set(name=name, body=body, repeat=repeat, **kwargs)


def _X(shape=(2, 3)):
    return tf.constant(np.random.randn(*shape).astype(np.float32))


def _NumElements(variables):
    return sum(int(np.prod(v.shape)) for v in variables)


def test_sequential_equals_manual_composition():
    layer = _Seq().Instantiate()
    x = _X()
    v = layer.vars.sub
    expected = (x.numpy() * v[0].w.numpy() + 1.0) @ v[2].w.numpy()
    test_utils.AssertAllClose(layer(x), expected)
    assert layer(x).shape == (2, 4)


def test_sequential_child_names_and_variable_paths():
    sub = [Scale.Params(), Scale.Params().Set(name="named"), AddOne.Params()]
    layer = _Seq(sub=sub).Instantiate()
    assert [c.path for c in layer.sub] == ["seq/sub_0", "seq/named", "seq/sub_2"]
    assert sorted(v.name for v in layer.variables) == ["seq/named/w:0", "seq/sub_0/w:0"]


def test_sequential_tuple_is_splatted():
    layer = _Seq(sub=[Fork.Params(), Join.Params()]).Instantiate()
    x = _X()
    v = layer.vars.sub
    a, b = x.numpy() * v[0].w.numpy(), x.numpy() + 1.0
    test_utils.AssertAllClose(layer(x), a + b * v[1].w.numpy())


def test_sequential_first_child_takes_several_args():
    layer = _Seq(sub=[Join.Params(), AddOne.Params()]).Instantiate()
    a, b = _X(), _X()
    expected = a.numpy() + b.numpy() * layer.vars.sub[0].w.numpy() + 1.0
    test_utils.AssertAllClose(layer(a, b), expected)


def test_sequential_nested_map_passes_through():
    layer = _Seq(sub=[ToMap.Params(), MapScale.Params(), FromMap.Params()]).Instantiate()
    x = _X()
    expected = x.numpy() * layer.vars.sub[1].w.numpy() + 2.0 * x.numpy()
    test_utils.AssertAllClose(layer(x), expected)
    # The last child's NestedMap comes back as it is.
    out = _Seq(name="s2", sub=[ToMap.Params(), MapScale.Params()]).Instantiate()(x)
    assert isinstance(out, NestedMap) and sorted(out) == ["x", "y"]


def test_sequential_fprop_uses_theta():
    layer = _Seq().Instantiate()
    x = _X()
    theta = layer.theta.Transform(tf.ones_like)
    test_utils.AssertAllClose(layer.FProp(theta, x), (x.numpy() + 1.0) @ np.ones([3, 4]))


def test_sequential_fprop_meta():
    p = _Seq()
    with test_utils.CountVariables() as counter:
        meta = sequential.SequentialLayer.FPropMeta(p, [2, 3])
    assert counter.count == 0
    assert meta.out_shapes == (tf.TensorShape([2, 4]),)
    assert meta.flops == 6 + 6 + 2 * 2 * 3 * 4
    layer = p.Instantiate()
    assert meta.num_params == 3 + 12 == _NumElements(layer.trainable_variables)
    assert layer(_X()).shape == meta.out_shapes[0]


def test_sequential_fprop_meta_tuple_and_nested_map():
    meta = sequential.SequentialLayer.FPropMeta(_Seq(sub=[Fork.Params(), Join.Params()]), [2, 3])
    assert meta.out_shapes == (tf.TensorShape([2, 3]),)
    assert meta.flops == 12 + 12 and meta.num_params == 6
    p = _Seq(sub=[ToMap.Params(), MapScale.Params()])
    meta = sequential.SequentialLayer.FPropMeta(p, tf.TensorShape([2, 3]))
    out = p.Instantiate()(_X())
    assert meta.out_shapes[0].x == out.x.shape and meta.out_shapes[0].y == out.y.shape
    assert meta.num_params == 3


def test_sequential_gradients_eager_function():
    layer = _Seq(sub=[Fork.Params(), Join.Params(), Scale.Params(), Dense.Params()]).Instantiate()
    x = _X()
    test_utils.AssertGradientsExist(layer, lambda: tf.reduce_sum(layer(x) ** 2))
    assert len(layer.trainable_variables) == 4
    test_utils.AssertEagerEqualsFunction(layer, x)


def test_sequential_checkpoint_round_trip(tmp_path):
    seeds = iter([1, 2])
    test_utils.CheckpointRoundTrip(
        lambda: _Seq(random_seed=next(seeds)).Instantiate(), _X(), str(tmp_path)
    )


def test_sequential_errors():
    with pytest.raises(ValueError, match=r"seq: expected sub to be a non-empty list.*sub=\[\]"):
        _Seq(sub=[]).Instantiate()
    with pytest.raises(ValueError, match=r"seq: expected sub to be a non-empty list"):
        sequential.SequentialLayer.FPropMeta(_Seq(sub=[]), [2, 3])
    with pytest.raises(ValueError, match=r"seq: expected the layers of sub to have distinct"):
        _Seq(sub=[AddOne.Params().Set(name="a"), AddOne.Params().Set(name="a")]).Instantiate()


def test_repeat_equals_manual_composition():
    layer = _Rep().Instantiate()
    x = _X()
    expected = x.numpy()
    for v in layer.vars.body:
        expected = expected @ v.w.numpy()
    test_utils.AssertAllClose(layer(x), expected)


def test_repeat_copies_have_distinct_weights_and_paths():
    layer = _Rep(body=Dense.Params().Set(name="ignored")).Instantiate()
    assert [c.path for c in layer.body] == ["rep/body_0", "rep/body_1", "rep/body_2"]
    assert [v.name for v in layer.vars.Flatten()] == [f"rep/body_{i}/w:0" for i in range(3)]
    w = [v.w.numpy() for v in layer.vars.body]
    assert not np.allclose(w[0], w[1]) and not np.allclose(w[1], w[2])


def test_repeat_fprop_meta():
    p = _Rep(body=_Seq(sub=[Scale.Params(), AddOne.Params()]), repeat=4)
    with test_utils.CountVariables() as counter:
        meta = sequential.RepeatLayer.FPropMeta(p, [5, 3])
    assert counter.count == 0
    assert meta.out_shapes == (tf.TensorShape([5, 3]),)
    assert meta.flops == 4 * (15 + 15)
    layer = p.Instantiate()
    assert meta.num_params == 4 * 3 == _NumElements(layer.trainable_variables)
    assert layer(_X((5, 3))).shape == meta.out_shapes[0]
    assert layer.body[3].sub[0].path == "rep/body_3/sub_0"


def test_repeat_once_may_change_shape():
    p = _Rep(body=Dense.Params().Set(output_dims=5), repeat=1)
    meta = sequential.RepeatLayer.FPropMeta(p, [2, 3])
    assert meta.out_shapes == (tf.TensorShape([2, 5]),) and meta.num_params == 15
    assert p.Instantiate()(_X()).shape == (2, 5)


def test_repeat_gradients_eager_function():
    layer = _Rep(body=_Seq(sub=[Fork.Params(), Join.Params()])).Instantiate()
    x = _X()
    test_utils.AssertGradientsExist(layer, lambda: tf.reduce_sum(layer(x) ** 2))
    assert len(layer.trainable_variables) == 6
    test_utils.AssertEagerEqualsFunction(layer, x)


def test_repeat_checkpoint_round_trip(tmp_path):
    seeds = iter([1, 2])
    test_utils.CheckpointRoundTrip(
        lambda: _Rep(random_seed=next(seeds)).Instantiate(), _X(), str(tmp_path)
    )


def test_repeat_errors():
    with pytest.raises(ValueError, match=r"rep: expected repeat to be a positive integer.*=0"):
        _Rep(repeat=0).Instantiate()
    with pytest.raises(ValueError, match=r"rep: expected repeat to be a positive integer.*=-1"):
        sequential.RepeatLayer.FPropMeta(_Rep(repeat=-1), [2, 3])
    with pytest.raises(ValueError, match=r"rep: expected body to be layer params.*body=None"):
        sequential.RepeatLayer.Params().Set(name="rep").Instantiate()
    p = _Rep(body=Dense.Params().Set(output_dims=5), repeat=2)
    with pytest.raises(
        ValueError,
        match=r"rep: repeat=2 needs a body whose output shapes equal.*\[2, 3\].*\[2, 5\]",
    ):
        sequential.RepeatLayer.FPropMeta(p, [2, 3])


@pytest.mark.skipif(
    importlib.util.find_spec("lingpipe.layers.linear") is None, reason="linear.py not written yet"
)
def test_sequential_of_projection_layers():
    from lingpipe.layers import linear

    proj = linear.ProjectionLayer.Params
    sub = [
        proj().Set(input_dims=3, output_dims=4, activation="RELU"),
        proj().Set(input_dims=4, output_dims=2, activation="NONE", has_bias=False),
    ]
    p = _Seq(name="mlp", sub=sub)
    meta = sequential.SequentialLayer.FPropMeta(p, [2, 3])
    layer = p.Instantiate()
    x = _X()
    v = layer.vars.sub
    hidden = np.maximum(x.numpy() @ v[0].w.numpy() + v[0].b.numpy(), 0.0)
    test_utils.AssertAllClose(layer(x), hidden @ v[1].w.numpy())
    assert meta.out_shapes == (tf.TensorShape([2, 2]),)
    assert meta.num_params == 3 * 4 + 4 + 4 * 2 == _NumElements(layer.trainable_variables)
    assert sorted(v.name for v in layer.variables) == [
        "mlp/sub_0/b:0",
        "mlp/sub_0/w:0",
        "mlp/sub_1/w:0",
    ]
