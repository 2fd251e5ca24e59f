"""Dynamic loss scaling for float16 training.

float16 holds magnitudes from about 6e-8 to 65504: the small gradients of a
float16 backward round to zero. Multiplying the loss by a large scale S before
the backward lifts them into range, and dividing the gradients by S (in float32)
afterwards gives the true gradients back. Too large an S overflows: some
gradient is inf or NaN. The dynamic scale finds S as it trains:

    scale = loss_scale.DynamicLossScale.Params().Instantiate()
    grads = unscaled gradients of (loss * scale.value)   # the pipeline's executor does this
    finite = loss_scale.AllFinite(grads)
    apply the update only if finite                    # else the step is skipped
    scale.Update(finite)   # not finite: S / factor; growth_interval finite steps: S * factor

The scale and the count of good steps are variables: a task with a loss scale
tracks it, so checkpoints save and restore them with the weights.
"""

from __future__ import annotations

import tensorflow as tf

from lingpipe import asserts, hyperparams

__all__ = [
    "AllFinite",
    "DynamicLossScale",
]


def AllFinite(tensors: list) -> tf.Tensor:
    """Whether every tensor (None: skipped) is all finite; each checked on its device."""
    flags = []
    for t in tensors:
        if t is not None:
            with tf.device(t.device):
                flags.append(tf.reduce_all(tf.math.is_finite(t)))
    return tf.reduce_all(tf.stack(flags)) if flags else tf.constant(True)


class DynamicLossScale(tf.Module):
    """The loss scale S and the number of finite steps since it last changed."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = hyperparams.InstantiableParams(cls)
        p.Define("name", "loss_scale", "A Python identifier; it names the variables.")
        p.Define("initial_scale", 2.0**15, "S at the start of training.")
        p.Define("growth_interval", 2000, "After this many finite steps in a row, S *= factor.")
        p.Define("factor", 2.0, "What S is multiplied by to grow and divided by to shrink.")
        p.Define("min_scale", 1.0, "S never goes below this.")
        return p

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        hyperparams.CheckInstantiable(params, self)
        super().__init__(name=params.name)
        p = params.Copy().Freeze()
        where = f"DynamicLossScale {p.name!r}"
        asserts.Gt(p.initial_scale, 0, "initial_scale", where=where)
        asserts.Positive(p.growth_interval, "growth_interval", where=where)
        asserts.Gt(p.factor, 1, "factor", where=where)
        asserts.Gt(p.min_scale, 0, "min_scale", where=where)
        object.__setattr__(self, "_params", p)
        with tf.init_scope():
            self.scale = tf.Variable(float(p.initial_scale), trainable=False, name="scale")
            self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="good_steps")

    @property
    def params(self) -> hyperparams.InstantiableParams:
        return self._params

    @property
    def value(self) -> tf.Tensor:
        """S, a float32 scalar."""
        return tf.convert_to_tensor(self.scale)

    def Update(self, finite: tf.Tensor) -> tf.Tensor:
        """Lowers S after a step whose gradients were not all finite, raises it after
        growth_interval finite ones; returns the new S."""
        p = self.params
        good = tf.where(finite, self.good_steps + 1, tf.zeros([], tf.int64))
        grow = good >= p.growth_interval
        scale = tf.where(
            finite,
            tf.where(grow, self.scale * p.factor, self.scale),
            tf.maximum(self.scale / p.factor, p.min_scale),
        )
        self.good_steps.assign(tf.where(grow, tf.zeros([], tf.int64), good))
        return self.scale.assign(scale)
