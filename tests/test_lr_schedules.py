"""Tests of lingpipe.lr_schedules against values computed by hand."""

import math

import numpy as np
import pytest
import tensorflow as tf

from lingpipe import hyperparams, lr_schedules


def _Values(schedule, steps):
    """Value at each step: python ints eagerly, and int64 tensors inside tf.function."""
    eager = [schedule.Value(s) for s in steps]
    traced_fn = tf.function(schedule.Value)
    traced = [traced_fn(tf.constant(s, tf.int64)) for s in steps]
    for e, t in zip(eager, traced):
        assert e.dtype == tf.float32 and e.shape == [] and t.dtype == tf.float32
    np.testing.assert_allclose([t.numpy() for t in traced], [e.numpy() for e in eager], rtol=1e-6)
    return [float(e) for e in eager]


def test_constant_is_one():
    assert _Values(lr_schedules.Constant.Params().Instantiate(), [0, 7, 10**6]) == [1.0, 1.0, 1.0]


def test_linear_warmup_rsqrt():
    schedule = lr_schedules.LinearWarmupRsqrt.Params().Set(warmup_steps=4).Instantiate()
    # (step + 1) / 4 up to the peak at step 3, then sqrt(4 / (step + 1)).
    expected = [0.25, 0.5, 0.75, 1.0, math.sqrt(4 / 5), math.sqrt(4 / 16), math.sqrt(4 / 100)]
    np.testing.assert_allclose(_Values(schedule, [0, 1, 2, 3, 4, 15, 99]), expected, rtol=1e-6)


def test_cosine_with_warmup():
    p = lr_schedules.Cosine.Params().Set(warmup_steps=2, total_steps=6, min_ratio=0.2)
    # Warmup 0.5, 1.0; then t = (step - 2) / 4: 0.2 + 0.8 * (1 + cos(pi t)) / 2.
    expected = [0.5, 1.0, 1.0, 0.2 + 0.4 * (1 + math.cos(math.pi / 4)), 0.6]
    expected += [0.2 + 0.4 * (1 + math.cos(3 * math.pi / 4)), 0.2, 0.2, 0.2]
    steps = [0, 1, 2, 3, 4, 5, 6, 7, 1000]
    np.testing.assert_allclose(_Values(p.Instantiate(), steps), expected, rtol=1e-6, atol=1e-7)


def test_cosine_without_warmup_starts_at_one_and_ends_at_zero():
    p = lr_schedules.Cosine.Params().Set(total_steps=10)
    values = _Values(p.Instantiate(), [0, 5, 10, 11])
    np.testing.assert_allclose(values, [1.0, 0.5, 0.0, 0.0], atol=1e-7)


def test_step_must_be_an_integer_scalar():
    schedule = lr_schedules.Constant.Params().Instantiate()
    with pytest.raises(ValueError, match=r"expected step to be an integer scalar, received 1.5"):
        schedule.Value(1.5)
    with pytest.raises(ValueError, match=r"integer scalar, .*shape \(2,\)"):
        schedule.Value(tf.constant([1, 2]))


_PARAMS_ERRORS = [
    (lr_schedules.LinearWarmupRsqrt, {"warmup_steps": 0}, "warmup_steps to be a positive integer"),
    (lr_schedules.LinearWarmupRsqrt, {"warmup_steps": 2.5}, r"received warmup_steps=2.5"),
    (
        lr_schedules.Cosine,
        {"warmup_steps": -1, "total_steps": 5},
        "expected warmup_steps to be a non-negative integer, received warmup_steps=-1",
    ),
    (lr_schedules.Cosine, {"total_steps": 0}, "expected total_steps to be a positive integer"),
    (
        lr_schedules.Cosine,
        {"warmup_steps": 5, "total_steps": 5},
        "expected total_steps > warmup_steps, received total_steps=5, warmup_steps=5",
    ),
    (
        lr_schedules.Cosine,
        {"total_steps": 5, "min_ratio": 1.5},
        r"Cosine 'cosine': expected min_ratio in \[0, 1\], received min_ratio=1.5",
    ),
    (lr_schedules.Cosine, {"total_steps": 5, "min_ratio": -0.1}, r"received min_ratio=-0.1"),
    (lr_schedules.Cosine, {}, "required param 'total_steps' was not set"),
]


@pytest.mark.parametrize("cls, values, message", _PARAMS_ERRORS)
def test_params_errors(cls, values, message):
    with pytest.raises(ValueError, match=message):
        cls.Params().Set(**values).Instantiate()


def test_non_instantiable_params_error():
    with pytest.raises(TypeError, match=r"expected InstantiableParams .* received Params"):
        lr_schedules.Constant(hyperparams.Params())
