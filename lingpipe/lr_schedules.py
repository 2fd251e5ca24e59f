"""Learning-rate schedules as params: multipliers of the task's base learning rate.

    schedule = lr_schedules.Cosine.Params().Set(warmup_steps=100, total_steps=1000).Instantiate()
    lr = base_learning_rate * schedule.Value(step)

`Value(step)` takes the 0-based training step (a python int or an integer
tensor, also inside `tf.function`) and returns a float32 scalar tensor.
"""

from __future__ import annotations

import math
import numbers

import tensorflow as tf

from lingpipe import hyperparams

__all__ = [
    "BaseSchedule",
    "Constant",
    "Cosine",
    "LinearWarmupRsqrt",
]


def _CheckSteps(value: object, name: str, where: str, allow_zero: bool = False) -> None:
    """Raises ValueError unless `value` is an int > 0 (>= 0 with allow_zero)."""
    ok = isinstance(value, int) and not isinstance(value, bool)
    ok = ok and (value >= 0 if allow_zero else value > 0)
    if not ok:
        kind = "a non-negative integer" if allow_zero else "a positive integer"
        raise ValueError(f"{where}: expected {name} to be {kind}, received {name}={value!r}")


class BaseSchedule:
    """A schedule: `Value(step)` is the learning-rate multiplier at `step`."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        """The params of this schedule class, with their defaults."""
        p = hyperparams.InstantiableParams(cls)
        p.Define("name", cls.__name__.lower(), "Name of the schedule, used in messages.")
        return p

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        hyperparams.CheckInstantiable(params, self)
        self._params = params.Copy().Freeze()
        self._CheckParams(self._params, f"{type(self).__name__} {params.name!r}")

    @classmethod
    def _CheckParams(cls, p: hyperparams.Params, where: str) -> None:
        """Raises ValueError for invalid class-specific params."""

    @property
    def params(self) -> hyperparams.InstantiableParams:
        """This schedule's params (frozen)."""
        return self._params

    def Value(self, step: int | tf.Tensor) -> tf.Tensor:
        """The multiplier at 0-based `step`: a float32 scalar tensor.

        Raises:
          ValueError: `step` is not an integer scalar.
        """
        step_t = tf.convert_to_tensor(step)
        if not step_t.dtype.is_integer or step_t.shape.rank != 0:
            raise ValueError(
                f"{type(self).__name__} {self.params.name!r}: expected step to be an integer "
                f"scalar, received {step!r} (dtype {step_t.dtype.name}, shape {step_t.shape})"
            )
        return self._Value(tf.cast(step_t, tf.float32))

    def _Value(self, step: tf.Tensor) -> tf.Tensor:
        """The multiplier at `step` (a float32 scalar tensor)."""
        raise TypeError(f"{type(self).__name__} must define _Value(self, step)")


class Constant(BaseSchedule):
    """1.0 at every step: the base learning rate unchanged."""

    def _Value(self, step: tf.Tensor) -> tf.Tensor:
        return tf.ones([], tf.float32)


class LinearWarmupRsqrt(BaseSchedule):
    """The Transformer's schedule normalised to a peak of 1 at the end of warmup:
    min((step + 1) / warmup_steps, sqrt(warmup_steps / (step + 1)))."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define(
            "warmup_steps",
            4000,
            "Steps of linear warmup; the peak, 1.0, is at step warmup_steps - 1.",
        )
        return p

    @classmethod
    def _CheckParams(cls, p: hyperparams.Params, where: str) -> None:
        _CheckSteps(p.warmup_steps, "warmup_steps", where)

    def _Value(self, step: tf.Tensor) -> tf.Tensor:
        warmup = float(self.params.warmup_steps)
        steps_done = step + 1.0
        return tf.minimum(steps_done / warmup, tf.sqrt(warmup / steps_done))


class Cosine(BaseSchedule):
    """Linear warmup to 1, then cosine decay to min_ratio at total_steps, flat after.

    Warmup: (step + 1) / warmup_steps for step < warmup_steps. Then, with
    t = (step - warmup_steps) / (total_steps - warmup_steps) clipped to [0, 1]:
    min_ratio + (1 - min_ratio) * (1 + cos(pi * t)) / 2.
    """

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("warmup_steps", 0, "Steps of linear warmup; 0 starts the decay at once.")
        p.Define(
            "total_steps",
            hyperparams.REQUIRED,
            "Step where the decay reaches min_ratio; greater than warmup_steps.",
        )
        p.Define("min_ratio", 0.0, "Multiplier at and after total_steps, in [0, 1].")
        return p

    @classmethod
    def _CheckParams(cls, p: hyperparams.Params, where: str) -> None:
        _CheckSteps(p.warmup_steps, "warmup_steps", where, allow_zero=True)
        _CheckSteps(p.total_steps, "total_steps", where)
        if p.total_steps <= p.warmup_steps:
            raise ValueError(
                f"{where}: expected total_steps > warmup_steps, received "
                f"total_steps={p.total_steps}, warmup_steps={p.warmup_steps}"
            )
        ratio = p.min_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, numbers.Real) or not 0 <= ratio <= 1:
            raise ValueError(f"{where}: expected min_ratio in [0, 1], received min_ratio={ratio!r}")

    def _Value(self, step: tf.Tensor) -> tf.Tensor:
        p = self.params
        warmup, total = float(p.warmup_steps), float(p.total_steps)
        progress = tf.clip_by_value((step - warmup) / (total - warmup), 0.0, 1.0)
        decay = p.min_ratio + (1.0 - p.min_ratio) * 0.5 * (1.0 + tf.cos(math.pi * progress))
        if p.warmup_steps == 0:
            return decay
        return tf.where(step < warmup, (step + 1.0) / warmup, decay)
