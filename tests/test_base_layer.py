"""BaseLayer: construction, theta/vars, naming, devices, checkpoints, WeightInit."""

import numpy as np
import pytest
import tensorflow as tf

from lingpipe import base_layer, test_utils
from lingpipe.base_layer import WeightInit, WeightParams


class Scale(base_layer.BaseLayer):
    @classmethod
    def Params(cls):
        p = super().Params()
        p.Define("dims", 3, "Size of the scaled dimension.")
        return p

    def __init__(self, params):
        super().__init__(params)
        self.CreateVariable("w", WeightParams([self.params.dims]))

    def FProp(self, theta, inputs):
        return inputs * theta.w

    @classmethod
    def FPropMeta(cls, p, inputs):
        shape = base_layer.ToShape(inputs)
        return base_layer.Meta(shape, shape.num_elements(), p.dims)


class Tree(base_layer.BaseLayer):
    """A child, a list of children on another device, and a variable of its own."""

    @classmethod
    def Params(cls):
        p = super().Params()
        p.Define("first", Scale.Params(), "The first child.")
        p.Define("num_rest", 2, "How many more Scale children.")
        return p

    def __init__(self, params):
        super().__init__(params)
        p = self.params
        self.CreateChild("first", p.first)
        with tf.device("/device:CPU:1"):
            self.CreateChildren("rest", [Scale.Params()] * p.num_rest)
        self.CreateVariable("bias", WeightParams([3], init=WeightInit.Constant(0.5)))

    def FProp(self, theta, inputs):
        x = self.first.FProp(theta.first, inputs)
        for child, child_theta in zip(self.rest, theta.rest):
            x = child.FProp(child_theta, x)
        return x + theta.bias


def _Tree(**kw):
    return Tree.Params().Set(name="tree", **kw).Instantiate()


def test_vars_and_theta_mirror_the_child_tree():
    tree = _Tree()
    assert sorted(tree.vars.keys()) == ["bias", "first", "rest"]
    assert len(tree.theta.rest) == 2
    assert tree.theta.rest[1].w is tree.rest[1].vars.w
    assert len(tree.trainable_variables) == 4


def test_descendants_walk_children_and_lists_of_children_in_order():
    outer = Tree.Params().Set(name="outer", first=Tree.Params(), num_rest=1).Instantiate()
    paths = [layer.path for layer in outer.Descendants()]
    assert paths == [
        "outer/first",
        "outer/first/first",
        "outer/first/rest_0",
        "outer/first/rest_1",
        "outer/rest_0",
    ]


def test_variable_names_follow_the_layer_path():
    names = sorted(v.name for v in _Tree().variables)
    assert names == ["tree/bias:0", "tree/first/w:0", "tree/rest_0/w:0", "tree/rest_1/w:0"]


def test_variables_live_on_the_device_scope_of_construction():
    tree = _Tree()
    assert tree.first.vars.w.device.endswith("CPU:0")
    assert all(c.vars.w.device.endswith("CPU:1") for c in tree.rest)


def test_call_runs_fprop_with_own_theta_and_theta_can_be_substituted():
    tree = _Tree()
    x = tf.constant([1.0, 2.0, 3.0])
    w = [tree.first.vars.w.numpy()] + [c.vars.w.numpy() for c in tree.rest]
    np.testing.assert_allclose(tree(x).numpy(), x.numpy() * w[0] * w[1] * w[2] + 0.5, rtol=1e-6)
    zeros = tree.theta.Transform(tf.zeros_like)
    np.testing.assert_array_equal(tree.FProp(zeros, x).numpy(), np.zeros(3))


def test_eager_equals_function_and_gradients_exist():
    tree = _Tree()
    x = tf.constant([1.0, -2.0, 3.0])
    test_utils.AssertEagerEqualsFunction(tree, x)
    test_utils.AssertGradientsExist(tree, lambda: tf.reduce_sum(tree(x)))


def test_same_params_give_same_weights_and_seed_changes_them():
    a, b, c = _Tree(), _Tree(), _Tree(random_seed=7)
    for va, vb, vc in zip(a.variables, b.variables, c.variables):
        np.testing.assert_array_equal(va.numpy(), vb.numpy())
        if va.name != "tree/bias:0":
            assert not np.array_equal(va.numpy(), vc.numpy())


def test_children_inherit_random_seed_and_dtype():
    tree = _Tree(random_seed=3, dtype=tf.float64)
    assert tree.first.params.random_seed == 3
    assert tree.rest[0].vars.w.dtype == tf.float64


def test_checkpoint_round_trip_into_a_fresh_tree(tmp_path):
    seeds = iter([1, 2])
    test_utils.CheckpointRoundTrip(
        lambda: _Tree(random_seed=next(seeds)), tf.constant([1.0, 2.0, 3.0]), str(tmp_path)
    )
    path = tf.train.Checkpoint(model=_Tree()).write(str(tmp_path / "names"))
    keys = {k for k, _ in tf.train.list_variables(path)}
    assert "model/rest_1/w/.ATTRIBUTES/VARIABLE_VALUE" in keys


def test_params_are_copied_and_frozen():
    p = Tree.Params().Set(name="tree")
    tree = p.Instantiate()
    p.num_rest = 5
    assert tree.params.num_rest == 2
    with pytest.raises(TypeError, match="frozen"):
        tree.params.num_rest = 3


def test_fprop_meta_builds_nothing():
    with test_utils.CountVariables() as counter:
        meta = Scale.FPropMeta(Scale.Params().Set(name="s", dims=4), [2, 4])
    assert counter.count == 0
    assert meta.out_shapes == (tf.TensorShape([2, 4]),) and meta.num_params == 4


def test_missing_name_is_an_error():
    with pytest.raises(ValueError, match="Scale: params.name is not set"):
        Scale.Params().Instantiate()


def test_bad_name_is_an_error():
    with pytest.raises(
        ValueError, match="expected params.name to be a Python identifier, received name='a/b'"
    ):
        Scale.Params().Set(name="a/b").Instantiate()


def test_create_variable_after_construction_is_an_error():
    tree = _Tree()
    with pytest.raises(ValueError, match=r"tree: CreateVariable\('z'\) must be called inside"):
        tree.CreateVariable("z", WeightParams([1]))
    with pytest.raises(ValueError, match=r"tree: CreateChild\('c'\) must be called inside"):
        tree.CreateChild("c", Scale.Params())


def test_duplicate_child_and_negative_shape_are_errors():
    class Dup(base_layer.BaseLayer):
        def __init__(self, params):
            super().__init__(params)
            self.CreateVariable("w", WeightParams([2]))
            self.CreateVariable("w", WeightParams([2]))

    with pytest.raises(ValueError, match="dup: a child or variable named 'w' already exists"):
        Dup.Params().Set(name="dup").Instantiate()

    class Neg(base_layer.BaseLayer):
        def __init__(self, params):
            super().__init__(params)
            self.CreateVariable("w", WeightParams([2, -1]))

    with pytest.raises(
        ValueError,
        match=r"neg: variable 'w' needs a shape of non-negative "
        r"integers, received shape=\[2, -1\]",
    ):
        Neg.Params().Set(name="neg").Instantiate()


def test_child_params_must_be_layer_params():
    class Bad(base_layer.BaseLayer):
        def __init__(self, params):
            super().__init__(params)
            self.CreateChild("c", base_layer.WeightParams([1]))

    with pytest.raises(TypeError, match="bad: expected the params of a BaseLayer subclass"):
        Bad.Params().Set(name="bad").Instantiate()


def test_unknown_attribute_lists_children():
    with pytest.raises(
        AttributeError,
        match=r"has no attribute 'nope'; its children are "
        r"\['first', 'rest'\]",
    ):
        _Tree().nope  # noqa: B018


def test_fprop_and_meta_must_be_defined():
    layer = base_layer.BaseLayer.Params().Set(name="bare").Instantiate()
    with pytest.raises(TypeError, match="BaseLayer must define FProp"):
        layer(tf.ones([1]))
    with pytest.raises(TypeError, match="BaseLayer must define FPropMeta"):
        base_layer.BaseLayer.FPropMeta(layer.params, [1])


def test_eval_mode_nests():
    assert not base_layer.DoEval()
    with base_layer.EvalMode():
        assert base_layer.DoEval()
        with base_layer.EvalMode(False):
            assert not base_layer.DoEval()
        assert base_layer.DoEval()
    assert not base_layer.DoEval()


@pytest.mark.parametrize(
    "init,check",
    [
        (WeightInit.Constant(0.25), lambda v: np.all(v == 0.25)),
        (WeightInit.Uniform(0.1), lambda v: np.all(np.abs(v) <= 0.1) and v.std() > 0.04),
        (WeightInit.Gaussian(2.0), lambda v: abs(v.std() - 2.0) < 0.1),
        (WeightInit.TruncatedGaussian(1.0), lambda v: np.all(np.abs(v) <= 2.0)),
        # fan_in=200, fan_out=100: limit sqrt(6/300)
        (WeightInit.Xavier(1.0), lambda v: np.abs(v).max() <= np.sqrt(6 / 300) + 1e-7),
        (WeightInit.GaussianSqrtDim(1.0), lambda v: abs(v.std() - 1 / np.sqrt(200)) < 0.005),
        (WeightInit.UniformSqrtDim(1.0), lambda v: np.abs(v).max() <= 1 / np.sqrt(200) + 1e-7),
    ],
)
def test_weight_init_methods(init, check):
    value = base_layer.InitialValue(init, [200, 100], tf.float32, (1, 2)).numpy()
    assert value.shape == (200, 100)
    assert check(value)


def test_weight_init_explicit_seed_and_unknown_method():
    a = base_layer.InitialValue(WeightInit.Gaussian(1.0, seed=5), [4], tf.float32, (5, 9))
    b = base_layer.InitialValue(WeightInit.Gaussian(1.0, seed=5), [4], tf.float32, (5, 9))
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    bad = WeightInit.Gaussian(1.0).Set(method="normalish")
    with pytest.raises(ValueError, match="unknown WeightInit method 'normalish'"):
        base_layer.InitialValue(bad, [2], tf.float32, (0, 0))


def test_fans():
    assert base_layer.Fans([3, 5]) == (3, 5)
    assert base_layer.Fans([3, 3, 4, 8]) == (36, 72)
    assert base_layer.Fans([7]) == (7, 7)
