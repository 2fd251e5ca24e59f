"""Dropout with stateless random masks, reproducible per step and micro-batch.

The mask is drawn with `tf.random.stateless_uniform` from a seed made of the
layer's path, its `random_seed` and the values of the enclosing
`seeds.StepSeedScope`s (the training step, then the micro-batch index). Stateful
random ops are avoided on purpose: `tf.function` chains them in program order,
which would serialize a pipeline, and a forward recomputed in backward must draw
the very same mask. To recompute outside the forward's scopes, replay them with
`seeds.RestoreScopeValues(seeds.CurrentScopeValues())` captured in the forward.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import tensorflow as tf

from lingpipe import base_layer, hyperparams, seeds
from lingpipe.nested_map import NestedMap

__all__ = [
    "DropoutLayer",
]


class DropoutLayer(base_layer.BaseLayer):
    """Training: zeroes each element with probability 1 - keep_prob, scales the rest by
    1 / keep_prob. Eval (or keep_prob == 1): identity."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("keep_prob", 1.0, "Probability to keep each element, in (0, 1]; 1.0 is identity.")
        p.Define(
            "noise_shape_broadcast_dims",
            None,
            "None, or the dims (ints, negative ones count from the end) where the mask has "
            "size 1 and is shared: [1] shares one mask over time for [batch, time, dims] inputs.",
        )
        return p

    @classmethod
    def _CheckParams(cls, p: hyperparams.Params, where: str) -> None:
        keep = p.keep_prob
        if isinstance(keep, bool) or not isinstance(keep, numbers.Real) or not 0 < keep <= 1:
            raise ValueError(
                f"{where}: expected keep_prob in (0, 1], received keep_prob={keep!r}; it is the "
                f"probability of keeping an element (1.0 turns dropout off)"
            )
        dims = p.noise_shape_broadcast_dims
        if dims is not None and (
            not isinstance(dims, (list, tuple))
            or any(isinstance(d, bool) or not isinstance(d, int) for d in dims)
        ):
            raise ValueError(
                f"{where}: expected noise_shape_broadcast_dims to be None or a list of ints, "
                f"received noise_shape_broadcast_dims={dims!r}"
            )

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        self._CheckParams(self.params, self.path)

    def _NoiseShape(self, inputs: tf.Tensor) -> tf.Tensor:
        """The mask's shape: the inputs' shape with 1 at noise_shape_broadcast_dims."""
        dims = self.params.noise_shape_broadcast_dims
        shape = tf.shape(inputs)
        if not dims:
            return shape
        rank = inputs.shape.rank
        if rank is None:
            raise ValueError(
                f"{self.path}: noise_shape_broadcast_dims needs inputs of known rank, "
                f"received shape {inputs.shape}"
            )
        bad = [d for d in dims if not -rank <= d < rank]
        if bad:
            raise ValueError(
                f"{self.path}: noise_shape_broadcast_dims={list(dims)} has dims {bad} out of "
                f"range for inputs of rank {rank} (shape {inputs.shape.as_list()})"
            )
        broadcast = {d % rank for d in dims}
        return tf.where([i in broadcast for i in range(rank)], tf.ones_like(shape), shape)

    def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
        """inputs: [batch, ...] floating point, any rank -> the same shape."""
        p = self.params
        inputs = tf.convert_to_tensor(inputs)
        if not inputs.dtype.is_floating:
            raise ValueError(f"{self.path}: expected floating inputs, received {inputs.dtype}")
        if self.do_eval or p.keep_prob == 1.0:
            return inputs
        seed = seeds.StatelessSeed(self.path, p.random_seed)
        mask = tf.random.stateless_uniform(self._NoiseShape(inputs), seed) < p.keep_prob
        return inputs * (tf.cast(mask, inputs.dtype) / tf.cast(p.keep_prob, inputs.dtype))

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, input_shape: Any) -> NestedMap:
        """FLOPs of training: a draw, a compare and a multiply an element (0 at keep_prob 1)."""
        cls._CheckParams(p, p.name)
        shape = base_layer.ToShape(input_shape)
        if not shape.is_fully_defined():
            raise ValueError(f"{p.name}: FPropMeta needs every input dim known, received {shape}")
        elements = int(np.prod(shape.as_list(), dtype=np.int64))
        return base_layer.Meta(shape, 0 if p.keep_prob == 1.0 else 3 * elements, 0)
