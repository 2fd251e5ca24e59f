"""Tests of lingpipe.layers.softmax."""

import numpy as np
import pytest
import tensorflow as tf

from lingpipe import test_utils
from lingpipe.layers import softmax
from lingpipe.nested_map import NestedMap

IN, C = 5, 6


def _LogSoftmax(logits):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _Params(**kwargs):
    p = softmax.SimpleFullSoftmax.Params().Set(name="softmax", input_dims=IN, num_classes=C)
    return p.Set(**kwargs)


def _Layer(**kwargs):
    layer = _Params(**kwargs).Instantiate()
    if layer.params.has_bias:
        layer.vars.bias.assign(np.random.normal(size=[C]).astype(np.float32))
    return layer


def _Inputs(shape=(4, IN)):
    return tf.constant(np.random.normal(size=shape).astype(np.float32))


def _Logits(shape=(4, C)):
    return np.random.normal(size=shape).astype(np.float32) * 2.0


def test_logits_match_numpy():
    layer = _Layer()
    w, b = layer.vars.weight.numpy(), layer.vars.bias.numpy()
    x = _Inputs([2, 3, IN])
    logits = layer.Logits(layer.theta, x)
    assert logits.shape == (2, 3, C)
    test_utils.AssertAllClose(logits, x.numpy() @ w + b, atol=1e-5)


def test_logits_without_bias():
    layer = _Layer(has_bias=False)
    assert sorted(layer.vars) == ["weight"]
    x = _Inputs()
    test_utils.AssertAllClose(layer.Logits(layer.theta, x), x.numpy() @ layer.vars.weight.numpy())


def test_fprop_class_ids_matches_numpy():
    layer = _Layer()
    x, ids = _Inputs(), np.array([0, 5, 2, 2])
    out = layer(x, class_ids=tf.constant(ids))
    logits = x.numpy() @ layer.vars.weight.numpy() + layer.vars.bias.numpy()
    log_probs = _LogSoftmax(logits)
    xent = -log_probs[np.arange(4), ids]
    test_utils.AssertAllClose(out.logits, logits, atol=1e-5)
    test_utils.AssertAllClose(out.log_probs, log_probs, atol=1e-5)
    test_utils.AssertAllClose(out.per_example_xent, xent, atol=1e-5)
    np.testing.assert_array_equal(out.per_example_argmax.numpy(), logits.argmax(-1))
    assert out.per_example_argmax.dtype == tf.int32
    test_utils.AssertAllClose(out.total_xent, xent.sum(), atol=1e-5)
    test_utils.AssertAllClose(out.total_weight, 4.0)
    test_utils.AssertAllClose(out.avg_xent, xent.mean(), atol=1e-5)


@pytest.mark.parametrize("ls", [0.0, 0.1, 0.5])
def test_cross_entropy_label_smoothing(ls):
    logits, ids = _Logits([2, 3, C]), np.array([[1, 0, 5], [3, 3, 2]])
    out = softmax.CrossEntropy(tf.constant(logits), class_ids=tf.constant(ids), label_smoothing=ls)
    targets = (1.0 - ls) * np.eye(C)[ids] + ls / C
    xent = -(targets * _LogSoftmax(logits)).sum(-1)
    assert out.per_example_xent.shape == (2, 3)
    test_utils.AssertAllClose(out.per_example_xent, xent, atol=1e-5)
    test_utils.AssertAllClose(out.avg_xent, xent.mean(), atol=1e-5)


def test_cross_entropy_weights_exclude_zero_rows():
    logits, ids = _Logits([5, C]), np.array([1, 2, 3, 4, 5])
    weights = np.array([1.0, 0.0, 2.0, 0.0, 0.5], np.float32)
    out = softmax.CrossEntropy(
        tf.constant(logits), class_ids=tf.constant(ids), class_weights=tf.constant(weights)
    )
    xent = -_LogSoftmax(logits)[np.arange(5), ids]
    test_utils.AssertAllClose(out.total_xent, (weights * xent).sum(), atol=1e-5)
    test_utils.AssertAllClose(out.total_weight, 3.5)
    test_utils.AssertAllClose(out.avg_xent, (weights * xent).sum() / 3.5, atol=1e-5)
    # With 0/1 weights the average is the mean over the kept rows only.
    mask = np.array([1, 0, 1, 0, 1], np.float32)
    kept = softmax.CrossEntropy(tf.constant(logits), class_ids=ids, class_weights=mask)
    test_utils.AssertAllClose(kept.avg_xent, xent[[0, 2, 4]].mean(), atol=1e-5)


def test_cross_entropy_all_weights_zero_is_zero_not_nan():
    out = softmax.CrossEntropy(
        tf.constant(_Logits()), class_ids=tf.constant([0, 1, 2, 3]), class_weights=tf.zeros([4])
    )
    assert out.total_weight.numpy() == 0.0
    assert out.avg_xent.numpy() == 0.0


@pytest.mark.parametrize("ls", [0.0, 0.2])
def test_cross_entropy_class_probabilities(ls):
    logits = _Logits([3, C])
    probs = np.random.uniform(size=[3, C]).astype(np.float32)
    probs /= probs.sum(-1, keepdims=True)
    out = softmax.CrossEntropy(
        tf.constant(logits), class_probabilities=tf.constant(probs), label_smoothing=ls
    )
    targets = (1.0 - ls) * probs + ls / C
    xent = -(targets * _LogSoftmax(logits)).sum(-1)
    test_utils.AssertAllClose(out.per_example_xent, xent, atol=1e-5)
    test_utils.AssertAllClose(out.avg_xent, xent.mean(), atol=1e-5)


def test_fprop_class_probabilities_and_layer_label_smoothing():
    layer = _Layer(label_smoothing=0.1)
    x = _Inputs()
    probs = np.eye(C, dtype=np.float32)[[0, 1, 2, 3]]
    by_probs = layer(x, class_probabilities=tf.constant(probs))
    by_ids = layer(x, class_ids=tf.constant([0, 1, 2, 3]))
    test_utils.AssertAllClose(by_probs.per_example_xent, by_ids.per_example_xent, atol=1e-5)
    logits = by_ids.logits.numpy()
    xent = -((0.9 * probs + 0.1 / C) * _LogSoftmax(logits)).sum(-1)
    test_utils.AssertAllClose(by_ids.per_example_xent, xent, atol=1e-5)


def test_fprop_uses_theta_not_vars():
    layer = _Layer()
    theta = NestedMap(weight=tf.ones([IN, C]), bias=tf.zeros([C]))
    x = _Inputs()
    out = layer.FProp(theta, x, class_ids=tf.constant([0, 0, 0, 0]))
    test_utils.AssertAllClose(out.logits, x.numpy() @ np.ones([IN, C], np.float32), atol=1e-5)


def test_gradients_exist():
    layer = _Layer(label_smoothing=0.1)
    x, ids = _Inputs(), tf.constant([1, 2, 3, 4])
    test_utils.AssertGradientsExist(layer, lambda: layer(x, class_ids=ids).avg_xent)


def test_eager_equals_function():
    layer = _Layer(label_smoothing=0.1)
    x, ids, w = _Inputs([2, 3, IN]), tf.constant([[1, 2, 3], [4, 5, 0]]), tf.ones([2, 3])
    test_utils.AssertEagerEqualsFunction(
        lambda a, b, c: layer(a, class_ids=b, class_weights=c), x, ids, w
    )


def test_variable_names_follow_path():
    layer = _Layer()
    assert sorted(v.name for v in layer.trainable_variables) == [
        "softmax/bias:0",
        "softmax/weight:0",
    ]
    np.testing.assert_array_equal(_Params().Instantiate().vars.bias.numpy(), np.zeros([C]))


@pytest.mark.parametrize("has_bias", [True, False])
def test_fprop_meta(has_bias):
    p = _Params(has_bias=has_bias)
    with test_utils.CountVariables() as counter:
        meta = softmax.SimpleFullSoftmax.FPropMeta(p, [2, 3, IN], [2, 3])
    assert counter.count == 0
    assert meta.out_shapes == (tf.TensorShape([2, 3, C]),)
    assert meta.num_params == IN * C + (C if has_bias else 0)
    assert meta.flops == 2 * 6 * IN * C + 5 * 6 * C + (6 * C if has_bias else 0)
    layer = p.Instantiate()
    # Trainable variables only: the layer has no non-trainable ones.
    assert meta.num_params == sum(int(np.prod(v.shape)) for v in layer.trainable_variables)
    assert layer.Logits(layer.theta, _Inputs([2, 3, IN])).shape == meta.out_shapes[0]


def test_fprop_meta_errors():
    with pytest.raises(ValueError, match=r"softmax: expected input_shape\[-1\] == input_dims"):
        softmax.SimpleFullSoftmax.FPropMeta(_Params(), [2, IN + 1])
    with pytest.raises(ValueError, match=r"softmax: FPropMeta needs every input dim known"):
        softmax.SimpleFullSoftmax.FPropMeta(_Params(), [None, IN])


def test_checkpoint_round_trip(tmp_path):
    x, ids = _Inputs(), tf.constant([0, 1, 2, 3])
    first = _Params(random_seed=1).Instantiate()
    first.vars.bias.assign(tf.range(C, dtype=tf.float32))
    expected = first(x, class_ids=ids)
    path = tf.train.Checkpoint(model=first).write(str(tmp_path / "ckpt"))
    second = _Params(random_seed=2).Instantiate()
    assert not np.allclose(second.vars.weight.numpy(), first.vars.weight.numpy())
    tf.train.Checkpoint(model=second).read(path).assert_existing_objects_matched().assert_consumed()
    test_utils.AssertAllClose(second(x, class_ids=ids), expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(num_classes=0),
            r"softmax: expected num_classes to be a positive integer, "
            r"received num_classes=0",
        ),
        (
            dict(input_dims=-1),
            r"softmax: expected input_dims to be a positive integer, "
            r"received input_dims=-1",
        ),
        (
            dict(label_smoothing=1.0),
            r"softmax: expected 0 <= label_smoothing < 1, "
            r"received label_smoothing=1.0",
        ),
        (dict(label_smoothing=-0.1), r"received label_smoothing=-0.1"),
        (dict(has_bias=1), r"softmax: expected has_bias to be a bool"),
    ],
)
def test_bad_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _Params(**kwargs).Instantiate()
    with pytest.raises(ValueError, match=message):
        softmax.SimpleFullSoftmax.FPropMeta(_Params(**kwargs), [2, IN])


def test_mismatched_input_dims():
    layer = _Layer()
    with pytest.raises(
        ValueError,
        match=r"softmax: expected inputs.shape\[-1\] == input_dims, received "
        r"inputs.shape\[-1\]=3, input_dims=5",
    ):
        layer(tf.zeros([2, 3]), class_ids=tf.constant([0, 1]))


@pytest.mark.parametrize("ls", [1.0, -0.5, 2])
def test_cross_entropy_label_smoothing_out_of_range(ls):
    with pytest.raises(ValueError, match=r"expected 0 <= label_smoothing < 1"):
        softmax.CrossEntropy(tf.constant(_Logits()), class_ids=[0, 1, 2, 3], label_smoothing=ls)


def test_cross_entropy_needs_exactly_one_target():
    logits = tf.constant(_Logits())
    with pytest.raises(
        ValueError,
        match=r"expected exactly one of class_ids and class_probabilities, "
        r"received neither",
    ):
        softmax.CrossEntropy(logits)
    with pytest.raises(ValueError, match=r"received both"):
        softmax.CrossEntropy(
            logits, class_ids=[0, 1, 2, 3], class_probabilities=tf.ones([4, C]) / C
        )
    layer = _Layer()
    with pytest.raises(ValueError, match=r"softmax: expected exactly one of .* received neither"):
        layer(_Inputs())


def test_cross_entropy_shape_and_dtype_errors():
    logits = tf.constant(_Logits())
    with pytest.raises(
        ValueError,
        match=r"expected class_ids.shape == \(4,\) to match logits, "
        r"received class_ids.shape=\(3,\)",
    ):
        softmax.CrossEntropy(logits, class_ids=tf.constant([0, 1, 2]))
    with pytest.raises(ValueError, match=r"expected integer class_ids"):
        softmax.CrossEntropy(logits, class_ids=tf.constant([0.0, 1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match=r"expected class_probabilities.shape == \(4, 6\)"):
        softmax.CrossEntropy(logits, class_probabilities=tf.ones([4, C + 1]))
    with pytest.raises(ValueError, match=r"expected class_weights.shape == \(4,\)"):
        softmax.CrossEntropy(logits, class_ids=[0, 1, 2, 3], class_weights=tf.ones([4, 1]))
    with pytest.raises(ValueError, match=r"expected floating-point logits"):
        softmax.CrossEntropy(tf.constant([[1, 2]]), class_ids=[0])
