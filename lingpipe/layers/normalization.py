"""Normalization layers: LayerNorm, and BatchNormLayer with statistics that survive micro-batches.

In training, BatchNormLayer normalizes with the moments of the inputs it was given.
The innermost statistics context decides what happens to its moving averages:

- none: each call updates them at once (plain, un-pipelined training);
- `BatchNormStats`: each call records (count, mean, variance); `stats.Apply()`
  combines the records of each layer exactly, as if the micro-batches were one
  batch (Chan's parallel formula), and updates each layer's moving averages once;
- `SuspendBatchNormUpdates`: calls neither record nor update.

Inside `base_layer.Recomputation()` (a pipeline replaying a forward in backward)
calls neither record nor update either, whatever the context: a recomputed
forward must not count its statistics twice.

    with normalization.BatchNormStats() as stats:
      for x in micro_batches:
        y = bn(x)
      stats.Apply()

The contexts are a thread-local stack read while FProp runs (or is traced), so a
pipeline enters them around the code that it traces.
"""

from __future__ import annotations

import contextlib
import numbers
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from lingpipe import asserts, base_layer, hyperparams
from lingpipe.nested_map import NestedMap

__all__ = [
    "BatchNormLayer",
    "BatchNormStats",
    "LayerNorm",
    "SuspendBatchNormUpdates",
]

_state = threading.local()
_SUSPENDED = "SuspendBatchNormUpdates"  # Stack entry of SuspendBatchNormUpdates().


def _StatsStack() -> list:
    if not hasattr(_state, "stack"):
        _state.stack = []
    return _state.stack


def _Pop(entry: Any) -> None:
    stack = _StatsStack()
    for i in range(len(stack) - 1, -1, -1):
        if stack[i] is entry:
            del stack[i]
            return


@contextlib.contextmanager
def SuspendBatchNormUpdates() -> Iterator[None]:
    """BatchNormLayers called inside neither record statistics nor update moving averages."""
    _StatsStack().append(_SUSPENDED)
    try:
        yield
    finally:
        _Pop(_SUSPENDED)


class BatchNormStats:
    """Collects the batch statistics of BatchNormLayer calls; Apply() updates each layer once.

    Records hold tensors: eager ones, or symbolic ones of the tf.function being
    traced, in which case Apply() must be called in that same function. The same
    object may be entered several times (e.g. once per micro-batch).
    """

    def __init__(self) -> None:
        self._layers: list[BatchNormLayer] = []
        self._records: dict[int, list[tuple[tf.Tensor, ...]]] = {}
        self._applied = False

    def __enter__(self) -> BatchNormStats:
        _StatsStack().append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _Pop(self)

    @property
    def layers(self) -> list[BatchNormLayer]:
        """The layers with records, in the order of their first record."""
        return list(self._layers)

    def NumRecords(self, layer: BatchNormLayer) -> int:
        return len(self._records.get(id(layer), []))

    def Record(
        self,
        layer: BatchNormLayer,
        count: tf.Tensor,
        mean: tf.Tensor,
        variance: tf.Tensor,
        residual: tf.Tensor | None = None,
    ) -> None:
        """Adds one call's statistics: count (scalar), mean and biased variance [dim].

        `variance` is taken about `mean` as rounded; `residual` [dim], the mean of
        (x - mean), recovers that rounding (None: 0). Without it, inputs whose mean is
        large against their spread (e.g. 1000 vs 1) lose ~1e-4 of the variance to the
        float32 rounding of each micro-batch's mean.
        """
        if self._applied:
            raise ValueError(
                f"{layer.path}: batch statistics recorded after BatchNormStats.Apply() would be "
                f"lost; use a new BatchNormStats for each step"
            )
        if id(layer) not in self._records:
            self._layers.append(layer)
            self._records[id(layer)] = []
        if residual is None:
            residual = tf.zeros_like(mean)
        self._records[id(layer)].append(
            tuple(tf.stop_gradient(t) for t in (count, mean, variance, residual))
        )

    def Combined(self, layer: BatchNormLayer) -> tuple[tf.Tensor, tf.Tensor]:
        """The (mean, variance) [dim] of all of `layer`'s records, as of one batch."""
        return self._Combine(layer)[1:]

    def _Combine(self, layer: BatchNormLayer) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        records = self._records.get(id(layer))
        if not records:
            raise ValueError(
                f"{layer.path}: no batch statistics were recorded for this layer in this "
                f"BatchNormStats (was it called in training mode inside the context?)"
            )
        counts, means, variances, residuals = (tf.stack(r) for r in zip(*records))
        total = tf.reduce_sum(counts)
        # Chan et al.: N = sum n_i, mean = sum n_i mu_i / N,
        # var = sum n_i (var_i + (mu_i - mean)^2) / N; stable because every term is
        # centred. Each record's second moment is about its rounded mean m_i, with
        # r_i = mean(x - m_i): mu_i = m_i + r_i and, about `mean`,
        # mean((x - mean)^2) = var_i + 2 (m_i - mean) r_i + (m_i - mean)^2, exactly.
        weights = tf.math.divide_no_nan(counts, total)[:, tf.newaxis]
        mean = tf.reduce_sum(weights * means, axis=0) + tf.reduce_sum(weights * residuals, axis=0)
        offsets = means - mean
        variance = tf.reduce_sum(
            weights * (variances + offsets * (2.0 * residuals + offsets)), axis=0
        )
        return total, mean, variance

    def Apply(self) -> list[Any]:
        """Updates each recorded layer's moving averages once; returns the assign results.

        Raises ValueError when called a second time. With no records it does nothing.
        """
        if self._applied:
            raise ValueError(
                "BatchNormStats.Apply() was already called; moving averages are updated once "
                "per step, use a new BatchNormStats for the next one"
            )
        self._applied = True
        updates = []
        for layer in self._layers:
            updates.extend(layer.UpdateMovingAverages(*self._Combine(layer)))
        return updates


def _CheckLastDim(inputs: tf.Tensor, dims: int, dims_name: str, min_rank: int, where: str) -> None:
    rank = inputs.shape.rank
    if rank is None:
        raise ValueError(f"{where}: expected inputs of known rank, received shape {inputs.shape}")
    if rank < min_rank:
        raise ValueError(
            f"{where}: expected inputs of rank >= {min_rank} ([..., {dims_name}]), received "
            f"inputs.shape={inputs.shape.as_list()}"
        )
    if inputs.shape[-1] is not None:
        asserts.Eq(inputs.shape[-1], dims, "inputs.shape[-1]", dims_name, where=where)


def _Meta(input_shape: Any, dims: int, dims_name: str, num_params: int, where: str) -> NestedMap:
    shape = base_layer.ToShape(input_shape)
    if shape.rank is None or shape.rank == 0:
        raise ValueError(f"{where}: FPropMeta expects an input shape of rank >= 1, got {shape}")
    asserts.Eq(shape[-1], dims, "input_shape[-1]", dims_name, where=where)
    if not shape.is_fully_defined():
        raise ValueError(f"{where}: FPropMeta needs every input dim known, received {shape}")
    # About 8 FLOPs an element: moments, centring, scaling, shift.
    return base_layer.Meta(shape, 8 * int(np.prod(shape.as_list(), dtype=np.int64)), num_params)


def _CheckEpsilon(epsilon: Any, where: str) -> None:
    if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real) or not epsilon > 0:
        raise ValueError(f"{where}: expected epsilon > 0, received epsilon={epsilon!r}")


class LayerNorm(base_layer.BaseLayer):
    """outputs = (x - mean) * rsqrt(var + epsilon) * scale + bias, moments over the last dim."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("input_dims", 0, "Size of the last dimension of the inputs.")
        p.Define("epsilon", 1e-6, "Added to the variance before the rsqrt.")
        return p

    @classmethod
    def _CheckParams(cls, p: hyperparams.Params, where: str) -> None:
        asserts.Positive(p.input_dims, "input_dims", where=where)
        _CheckEpsilon(p.epsilon, where)

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        self._CheckParams(p, self.path)
        const = base_layer.WeightInit.Constant
        self.CreateVariable("scale", base_layer.WeightParams([p.input_dims], init=const(1.0)))
        self.CreateVariable("bias", base_layer.WeightParams([p.input_dims], init=const(0.0)))

    def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
        """inputs: [..., input_dims] -> [..., input_dims], normalized over the last dim."""
        p = self.params
        inputs = tf.convert_to_tensor(inputs, dtype=self.fprop_dtype)
        _CheckLastDim(inputs, p.input_dims, "input_dims", 1, self.path)
        x = tf.cast(inputs, p.dtype)  # Moments in the variables' dtype (bfloat16 is too coarse).
        mean = tf.reduce_mean(x, axis=-1, keepdims=True)
        centred = x - mean
        variance = tf.reduce_mean(tf.square(centred), axis=-1, keepdims=True)
        out = centred * tf.math.rsqrt(variance + p.epsilon) * theta.scale + theta.bias
        return tf.cast(out, self.fprop_dtype)

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, input_shape: Any) -> NestedMap:
        cls._CheckParams(p, p.name)
        return _Meta(input_shape, p.input_dims, "input_dims", 2 * p.input_dims, p.name)


class BatchNormLayer(base_layer.BaseLayer):
    """Batch normalization over every axis but the last, with padding-aware moments.

    Variables: trainable `beta`, `gamma` [dim]; non-trainable `moving_mean`,
    `moving_variance` [dim], used in eval and updated in training as the module
    docstring says (moving = decay * moving + (1 - decay) * batch statistic).
    """

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("dim", 0, "Size of the last dimension of the inputs (the normalized channels).")
        p.Define("decay", 0.99, "Moving averages keep this fraction of their value per update.")
        p.Define("epsilon", 1e-3, "Added to the variance before the rsqrt.")
        return p

    @classmethod
    def _CheckParams(cls, p: hyperparams.Params, where: str) -> None:
        asserts.Positive(p.dim, "dim", where=where)
        decay = p.decay
        if isinstance(decay, bool) or not isinstance(decay, numbers.Real) or not 0 <= decay <= 1:
            raise ValueError(f"{where}: expected 0 <= decay <= 1, received decay={decay!r}")
        _CheckEpsilon(p.epsilon, where)

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        self._CheckParams(p, self.path)
        const = base_layer.WeightInit.Constant
        self.CreateVariable("beta", base_layer.WeightParams([p.dim], init=const(0.0)))
        self.CreateVariable("gamma", base_layer.WeightParams([p.dim], init=const(1.0)))
        for name, value in (("moving_mean", 0.0), ("moving_variance", 1.0)):
            self.CreateVariable(
                name, base_layer.WeightParams([p.dim], init=const(value)), trainable=False
            )

    def _Weights(self, inputs: tf.Tensor, paddings: Any) -> tf.Tensor | None:
        """1 - paddings as [..., 1] of the inputs' rank, or None without paddings."""
        if paddings is None:
            return None
        p = self.params
        paddings = tf.cast(tf.convert_to_tensor(paddings), p.dtype)
        rank = inputs.shape.rank
        if paddings.shape.rank == rank and paddings.shape[-1] == 1:
            paddings = paddings[..., 0]  # Lingvo's [..., 1] form.
        expected = inputs.shape[:-1]
        try:
            if paddings.shape.rank is None or paddings.shape.rank > rank - 1:
                raise ValueError("rank")
            tf.broadcast_static_shape(paddings.shape, expected)
        except ValueError:
            raise ValueError(
                f"{self.path}: expected paddings of shape inputs.shape[:-1]={expected.as_list()} "
                f"(or broadcastable to it), received paddings.shape={paddings.shape}"
            ) from None
        weights = tf.broadcast_to(1.0 - paddings, tf.shape(inputs)[:-1])
        return weights[..., tf.newaxis]

    def _Moments(
        self, x: tf.Tensor, weights: tf.Tensor | None
    ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
        """(count, mean, biased variance about mean, mean of x - mean), over all axes but -1."""
        axes = list(range(x.shape.rank - 1))
        if weights is None:
            count = tf.cast(tf.reduce_prod(tf.shape(x)[:-1]), x.dtype)
        else:
            count = tf.reduce_sum(weights)

        def Mean(t: tf.Tensor) -> tf.Tensor:
            t = t if weights is None else weights * t
            return tf.math.divide_no_nan(tf.reduce_sum(t, axis=axes), count)

        mean = Mean(x)
        centred = x - mean
        return count, mean, Mean(tf.square(centred)), Mean(centred)

    def UpdateMovingAverages(
        self, count: tf.Tensor, mean: tf.Tensor, variance: tf.Tensor
    ) -> list[Any]:
        """moving = decay * moving + (1 - decay) * value, on this layer's own variables.

        A batch with count 0 (all padded) carries no statistics and leaves them as they are.
        Returns the two assign results.
        """
        p = self.params
        updates = []
        for var, value in ((self.vars.moving_mean, mean), (self.vars.moving_variance, variance)):
            value = tf.stop_gradient(tf.cast(value, var.dtype))
            new = p.decay * var + (1.0 - p.decay) * value
            updates.append(var.assign(tf.where(count > 0, new, var)))
        return updates

    def FProp(self, theta: NestedMap, inputs: tf.Tensor, paddings: Any = None) -> tf.Tensor:
        """inputs: [batch, ..., dim] -> [batch, ..., dim].

        paddings: None, or [batch, ...] = inputs.shape[:-1] (or broadcastable to it, or
        Lingvo's [batch, ..., 1]), 1.0 at positions left out of the moments. Padded
        positions are normalized too; callers mask them as they need.
        """
        p = self.params
        inputs = tf.convert_to_tensor(inputs, dtype=self.fprop_dtype)
        _CheckLastDim(inputs, p.dim, "dim", 2, self.path)
        weights = self._Weights(inputs, paddings)
        x = tf.cast(inputs, p.dtype)
        if self.do_eval:
            mean, variance = theta.moving_mean, theta.moving_variance
        else:
            count, mean, variance, residual = self._Moments(x, weights)
            context = _StatsStack()[-1] if _StatsStack() else None
            if base_layer.IsRecomputing():
                pass  # A replay of a forward whose statistics were already recorded.
            elif isinstance(context, BatchNormStats):
                context.Record(self, count, mean, variance, residual)
            elif context is None:
                self.UpdateMovingAverages(count, mean + residual, variance - tf.square(residual))
        # (x - mean) * inv rather than x * inv - mean * inv: no cancellation at large means.
        inv = tf.math.rsqrt(variance + p.epsilon) * theta.gamma
        return tf.cast((x - mean) * inv + theta.beta, self.fprop_dtype)

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, input_shape: Any, *unused_shapes: Any) -> NestedMap:
        """num_params counts all four [dim] variables: trainable and moving statistics."""
        cls._CheckParams(p, p.name)
        return _Meta(input_shape, p.dim, "dim", 4 * p.dim, p.name)
