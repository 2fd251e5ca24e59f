"""Optimizers as params, built on Keras 3's optimizers.

An optimizer is declared like a layer and applied by the train loop with the
learning rate of the step (the task's base rate times its schedule's value):

    opt = optimizers.Adam.Params().Set(beta2=0.98).Instantiate()
    opt.Build(model.trainable_variables)     # once, eagerly: creates the slots

    @tf.function
    def Step(...):
      grads = ...
      opt.Apply(grads, model.trainable_variables, learning_rate=lr)

`Build` creates every slot variable eagerly, on the device of the variable it
belongs to: slots that Keras creates lazily while a `tf.function` is traced all
land on CPU:0, far from a pipeline stage's weights. The wrapper owns its Keras
optimizer as the tracked attribute `keras_optimizer`, so
`tf.train.Checkpoint(optimizer=opt)` saves the slots, the iteration count and
the last learning rate, but not the variables it updates: save the model beside
it (`BaseTask` tracks its optimizer, so `tf.train.Checkpoint(task=task)` does), and
each weight keeps its layer path as its checkpoint key. A checkpoint read before
Build fills the slots when Build creates them.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence

import keras
import tensorflow as tf

from lingpipe import cluster, hyperparams

__all__ = [
    "Adafactor",
    "Adam",
    "BaseOptimizer",
    "Momentum",
    "SGD",
]


def _CheckReal(
    value: object, name: str, where: str, interval: str, inside: Callable[[float], bool]
) -> None:
    """Raises ValueError unless `value` is a real number for which `inside` holds."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not inside(value):
        raise ValueError(f"{where}: expected {name} in {interval}, received {name}={value!r}")


def _CheckBool(value: object, name: str, where: str) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{where}: expected {name} to be a bool, received {name}={value!r}")


def _SlotBaseName(var: tf.Variable) -> str:
    """Keras's prefix for a variable's slots: its name with '/' and ':' as '_'."""
    return str(var.name).replace("/", "_").replace(":", "_")


class _ColocatedAdafactor(keras.optimizers.Adafactor):
    """Keras's Adafactor with every slot on its variable's device.

    Keras creates the factored second moments (row and column means) with
    `add_variable`, which does not colocate them, and a dummy pair of scalars
    for each variable of rank < 2. Here each variable's slots are made under
    `tf.device(var.device)` and the unused pair is None (Keras's update never
    reads it). The update rule is Keras's own.
    """

    def build(self, var_list: Sequence[tf.Variable]) -> None:
        if self.built:
            return
        keras.optimizers.Optimizer.build(self, var_list)
        self._r, self._c, self._v = [], [], []
        for var in var_list:
            overwrite = self._overwrite_variable_with_gradient(var)
            r = c = v = None
            with tf.device(cluster.VariableDevice(var)):
                shape = var.shape.as_list()
                if len(shape) >= 2 and not overwrite:
                    base = _SlotBaseName(var)
                    # Row means drop the last dim; column means drop the one before.
                    r = self.add_variable(shape[:-1], dtype=var.dtype, name=f"{base}_row")
                    c = self.add_variable(
                        shape[:-2] + shape[-1:], dtype=var.dtype, name=f"{base}_col"
                    )
                if not overwrite:
                    v = self.add_variable_from_reference(var, name="velocity")
            self._r.append(r)
            self._c.append(c)
            self._v.append(v)


def _AsReduced(grads_and_vars):
    """Stands in for Keras' all-reduce: lingpipe hands Apply the reduced gradients."""
    return list(grads_and_vars)


def _WithoutModelVariables(trackable_children: Callable) -> Callable:
    """Keras' checkpoint children without the list of the variables it updates.

    Keras tracks the model's variables it was built on; a checkpoint names each
    variable by its shortest path, which would then run through the optimizer
    (`task/optimizer/keras_optimizer/_trainable_variables/7`) instead of the
    layer path (`task/pipeline/cell_1/.../w`). The model saves its own variables.
    """

    def Children(*args, **kwargs):
        children = dict(trackable_children(*args, **kwargs))
        children.pop("_trainable_variables", None)
        return children

    return Children


class BaseOptimizer(tf.Module):
    """An optimizer from params: `Build(variables)` once, then `Apply` every step."""

    # Weight-sized slots kept per trainable weight (Adam's m and v: 2); None: not said.
    slots_per_weight: int | None = None

    @classmethod
    def SlotElements(cls, shapes: Sequence[Sequence[int]]) -> int | None:
        """Elements of the slots kept for trainable weights of these shapes (for memory
        estimates: times the weights' bytes per element); None if the class does not say."""
        if cls.slots_per_weight is None:
            return None
        return cls.slots_per_weight * sum(math.prod(s) for s in shapes)

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        """The params of this optimizer class, with their defaults."""
        p = hyperparams.InstantiableParams(cls)
        p.Define("name", cls.__name__.lower(), "A Python identifier; it prefixes the slots.")
        return p

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        hyperparams.CheckInstantiable(params, self)
        name = params.name
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(
                f"{type(self).__name__}: expected params.name to be a Python identifier, "
                f"received name={name!r}"
            )
        super().__init__(name=name)
        # object.__setattr__: plain Python state that tf.Module must not track.
        object.__setattr__(self, "_params", params.Copy().Freeze())
        object.__setattr__(self, "_built_refs", None)
        object.__setattr__(self, "_where", f"{type(self).__name__} {name!r}")
        self._CheckParams(self._params, self._where)
        with tf.init_scope():
            # The Keras optimizer keeps the learning rate in its own float32
            # variable; Apply assigns it before every update.
            keras_optimizer = self._CreateKerasOptimizer(self._params)
            # Gradients reach Apply already reduced over replicas (the train step
            # all-reduces them before clipping); Keras would sum them once more.
            object.__setattr__(keras_optimizer, "_all_reduce_sum_gradients", _AsReduced)
            object.__setattr__(
                keras_optimizer,
                "_trackable_children",
                _WithoutModelVariables(keras_optimizer._trackable_children),
            )
            self.keras_optimizer = keras_optimizer

    @classmethod
    def _CheckParams(cls, p: hyperparams.Params, where: str) -> None:
        """Raises ValueError for invalid class-specific params."""

    def _CreateKerasOptimizer(self, p: hyperparams.Params) -> keras.optimizers.Optimizer:
        raise TypeError(f"{type(self).__name__} must define _CreateKerasOptimizer(self, p)")

    @property
    def params(self) -> hyperparams.InstantiableParams:
        """This optimizer's params (frozen)."""
        return self._params

    @property
    def iterations(self) -> tf.Variable:
        """The number of updates applied so far (int64 scalar variable)."""
        return self.keras_optimizer.iterations.value

    @property
    def learning_rate(self) -> tf.Variable:
        """The learning rate of the last Apply (float32 scalar variable)."""
        return self.keras_optimizer.learning_rate.value

    @property
    def built(self) -> bool:
        return self._built_refs is not None

    def Build(self, variables: Sequence[tf.Variable]) -> None:
        """Creates the slot variables of `variables`, each on its variable's device.

        Runs eagerly (under `tf.init_scope` if called while tracing). Calling it again
        with the same variables does nothing.

        Raises:
          ValueError: `variables` is empty, holds something other than tf.Variables,
            or differs from the variables of an earlier Build.
        """
        variables = list(variables)
        where = self._where
        if not variables:
            raise ValueError(f"{where}: Build() needs at least one variable, received none")
        bad = [type(v).__name__ for v in variables if not isinstance(v, tf.Variable)]
        if bad:
            raise ValueError(f"{where}: Build() expects tf.Variables, received {bad}")
        refs = {v.ref() for v in variables}
        if self._built_refs is not None:
            if refs == self._built_refs:
                return
            raise ValueError(
                f"{where}: already built for {len(self._built_refs)} other variables, "
                f"received {len(refs)} variables that differ; an optimizer serves one set "
                f"of variables, instantiate another for these"
            )
        with tf.init_scope():
            self.keras_optimizer.build(variables)
        object.__setattr__(self, "_built_refs", refs)

    def Apply(
        self,
        grads: Sequence[tf.Tensor | None],
        variables: Sequence[tf.Variable],
        learning_rate: float | tf.Tensor,
    ) -> tf.Variable:
        """Updates `variables` by `grads` with `learning_rate`; returns `iterations`.

        Under a `tf.distribute` strategy with several replicas, `grads` must already
        be reduced over the replicas (`BaseTask.ApplyGradients` gets them so from the
        train step): Apply does not reduce them again, as a bare Keras optimizer would.

        Args:
          grads: one gradient per variable, of its shape (None skips the variable).
          variables: some or all of the variables given to Build.
          learning_rate: python float or float scalar tensor, the rate of this step.

        Raises:
          ValueError: Build was not called, a variable was not built, the numbers of
            grads and variables differ, or learning_rate is not a scalar.
        """
        where = self._where
        grads, variables = list(grads), list(variables)
        if self._built_refs is None:
            raise ValueError(
                f"{where}: Apply() was called before Build(); call opt.Build(variables) "
                f"once, eagerly, before the first Apply (slots created while a tf.function "
                f"is traced land on CPU:0, not beside their variables)"
            )
        if len(grads) != len(variables):
            raise ValueError(
                f"{where}: expected one gradient per variable, received {len(grads)} grads "
                f"for {len(variables)} variables"
            )
        unknown = [v.name for v in variables if v.ref() not in self._built_refs]
        if unknown:
            raise ValueError(
                f"{where}: variables {unknown} were not given to Build(); Build the "
                f"optimizer with every variable it will update"
            )
        lr = tf.cast(learning_rate, self.learning_rate.dtype)
        if lr.shape.rank != 0:
            raise ValueError(f"{where}: expected learning_rate to be a scalar, received {lr!r}")
        self.learning_rate.assign(lr)
        self.keras_optimizer.apply(grads, variables)
        return self.iterations

    def SlotVariables(self) -> list[tf.Variable]:
        """The slot variables (moments, accumulators), without iterations and rate."""
        own = {self.iterations.ref(), self.learning_rate.ref()}
        slots = [v.value for v in self.keras_optimizer.variables]
        return [v for v in slots if v.ref() not in own]


class SGD(BaseOptimizer):
    """Plain gradient descent: w -= lr * g."""

    slots_per_weight = 0

    def _CreateKerasOptimizer(self, p: hyperparams.Params) -> keras.optimizers.Optimizer:
        return keras.optimizers.SGD(learning_rate=0.0, momentum=0.0, name=p.name)


class Momentum(BaseOptimizer):
    """Heavy-ball momentum, Keras's form: m = alpha * m - lr * g; w += m.

    With Nesterov: m as above, then w += alpha * m - lr * g.
    """

    slots_per_weight = 1  # m

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("alpha", 0.9, "Momentum coefficient, in [0, 1].")
        p.Define("use_nesterov", False, "Whether to use Nesterov momentum.")
        return p

    @classmethod
    def _CheckParams(cls, p: hyperparams.Params, where: str) -> None:
        _CheckReal(p.alpha, "alpha", where, "[0, 1]", lambda x: 0 <= x <= 1)
        _CheckBool(p.use_nesterov, "use_nesterov", where)

    def _CreateKerasOptimizer(self, p: hyperparams.Params) -> keras.optimizers.Optimizer:
        return keras.optimizers.SGD(
            learning_rate=0.0, momentum=float(p.alpha), nesterov=p.use_nesterov, name=p.name
        )


class Adam(BaseOptimizer):
    """Adam, Keras's form: m, v moving averages of g and g^2, then
    w -= lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + epsilon)."""

    slots_per_weight = 2  # m and v

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("beta1", 0.9, "Decay of the first moment's moving average, in [0, 1).")
        p.Define("beta2", 0.999, "Decay of the second moment's moving average, in [0, 1).")
        p.Define("epsilon", 1e-8, "Added to sqrt(v) in the denominator; positive.")
        return p

    @classmethod
    def _CheckParams(cls, p: hyperparams.Params, where: str) -> None:
        _CheckReal(p.beta1, "beta1", where, "[0, 1)", lambda x: 0 <= x < 1)
        _CheckReal(p.beta2, "beta2", where, "[0, 1)", lambda x: 0 <= x < 1)
        _CheckReal(p.epsilon, "epsilon", where, "(0, inf)", lambda x: x > 0)

    def _CreateKerasOptimizer(self, p: hyperparams.Params) -> keras.optimizers.Optimizer:
        return keras.optimizers.Adam(
            learning_rate=0.0,
            beta_1=float(p.beta1),
            beta_2=float(p.beta2),
            epsilon=float(p.epsilon),
            name=p.name,
        )


class Adafactor(BaseOptimizer):
    """Adafactor (Shazeer and Stern, 2018), Keras's form: the second moment of a
    variable of rank >= 2 is kept factored, as row and column means over its last
    two dims; updates are clipped by their RMS and scaled by the variable's RMS."""

    @classmethod
    def SlotElements(cls, shapes: Sequence[Sequence[int]]) -> int:
        """A weight-sized slot per weight plus, for a weight of rank >= 2, its row means (all
        dims but the last) and column means (all but the one before the last), as
        _ColocatedAdafactor builds them."""
        factored = sum(
            math.prod(s[:-1]) + math.prod(s[:-2] + s[-1:]) for s in map(list, shapes) if len(s) >= 2
        )
        return sum(math.prod(s) for s in shapes) + factored

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define(
            "beta2_decay",
            -0.8,
            "Negative; the second moment decays with beta2 = 1 - step^beta2_decay.",
        )
        p.Define("epsilon_1", 1e-30, "Added to g^2 before averaging; positive.")
        p.Define("epsilon_2", 1e-3, "Floor of the variable's RMS that scales the step; >= 0.")
        p.Define("clip_threshold", 1.0, "Updates with RMS above this are scaled down; positive.")
        p.Define(
            "relative_step",
            False,
            "If True, the learning rate is capped at 1 / sqrt(step) (Keras's relative_step).",
        )
        return p

    @classmethod
    def _CheckParams(cls, p: hyperparams.Params, where: str) -> None:
        _CheckReal(p.beta2_decay, "beta2_decay", where, "(-inf, 0)", lambda x: x < 0)
        _CheckReal(p.epsilon_1, "epsilon_1", where, "(0, inf)", lambda x: x > 0)
        _CheckReal(p.epsilon_2, "epsilon_2", where, "[0, inf)", lambda x: x >= 0)
        _CheckReal(p.clip_threshold, "clip_threshold", where, "(0, inf)", lambda x: x > 0)
        _CheckBool(p.relative_step, "relative_step", where)

    def _CreateKerasOptimizer(self, p: hyperparams.Params) -> keras.optimizers.Optimizer:
        return _ColocatedAdafactor(
            learning_rate=0.0,
            beta_2_decay=float(p.beta2_decay),
            epsilon_1=float(p.epsilon_1),
            epsilon_2=float(p.epsilon_2),
            clip_threshold=float(p.clip_threshold),
            relative_step=p.relative_step,
            name=p.name,
        )
