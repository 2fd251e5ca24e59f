"""Sums of gradients over micro-batches, dense or as an embedding's slices.

The executor adds each micro-batch's weight gradient to a running sum, in float32. A
lookup's gradient (tf.gather: an Embedding) is a tf.IndexedSlices, one slice per row
looked up. Made dense, the sum is exact, but Keras' Adam, RMSprop and Adagrad treat
each slice on its own (they square each one), so to give them the plain model's
gradient the slices must be the plain model's slices:

  - rows looked up by the micro-batch's own ids (tokens): the plain model's lookup of
    the whole batch has each micro-batch's slices, so the sum concatenates them;
  - rows that do not depend on the micro-batch (positions 0..T-1, the same in every
    micro-batch): the plain model looks them up once, so the sum adds the slices
    position by position.

Which one a gradient is, is read from the traced graph: whether its indices depend on
the values of the stage's inputs (a shape does not count). Eagerly there is no graph,
and the slices are concatenated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from lingpipe.pipeline.step import precision

__all__ = [
    "Add",
    "DependsOn",
    "Finished",
    "Scaled",
    "Slices",
    "Summand",
    "Tensors",
]

# Ops whose output depends on their input's shape only, not on its values.
_SHAPE_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank"})


@dataclasses.dataclass
class Slices:
    """A running sum of an embedding's gradient: `slices` (float32 values), and whether
    its indices are `shared` by every micro-batch (see the module docstring)."""

    slices: tf.IndexedSlices
    shared: bool


def DependsOn(tensor: tf.Tensor, inputs: Sequence[Any]) -> bool:
    """Whether `tensor`'s value depends on the values of `inputs` in the traced graph."""
    if tf.executing_eagerly() or not hasattr(tensor, "op"):
        return True
    targets = {x.op for x in inputs if isinstance(x, tf.Tensor) and hasattr(x, "op")}
    seen, todo = set(), [tensor.op]
    while todo:
        op = todo.pop()
        if op in targets:
            return True
        if op in seen or op.type in _SHAPE_OPS:
            continue
        seen.add(op)
        todo.extend(t.op for t in op.inputs)
    return False


def Summand(g: Any, sparse: bool, inputs: Sequence[Any]) -> Any:
    """A micro-batch's gradient as a term of the sum, in float32 when narrow: dense, or
    (`sparse`, for Keras' optimizers) an embedding's slices, `inputs` being the stage's."""
    if not isinstance(g, tf.IndexedSlices):
        return precision.ForAccumulation(g)
    if not sparse:
        return precision.ForAccumulation(tf.convert_to_tensor(g))
    values = precision.ForAccumulation(g.values)
    shared = not DependsOn(g.indices, inputs)
    return Slices(tf.IndexedSlices(values, g.indices, g.dense_shape), shared)


def _Dense(g: Any) -> Any:
    return tf.convert_to_tensor(g.slices if isinstance(g, Slices) else g)


def Add(a: Any, b: Any) -> Any:
    """a + b, where None is nothing; the first term is copied, so that every accumulation
    is an op of the action that makes it. Slices add as the module docstring says; two
    tf.IndexedSlices (a weight used on two stages) are concatenated; a dense term makes
    the sum dense."""
    if a is None:
        if isinstance(b, Slices):
            s = b.slices
            return Slices(
                tf.IndexedSlices(tf.identity(s.values), s.indices, s.dense_shape), b.shared
            )
        return None if b is None else tf.identity(b)
    if b is None:
        return a
    if isinstance(a, Slices) and isinstance(b, Slices):
        x, y = a.slices, b.slices
        if a.shared and b.shared:
            return Slices(tf.IndexedSlices(x.values + y.values, x.indices, x.dense_shape), True)
        return Slices(_Concat(x, y), False)
    if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
        return _Concat(a, b)
    return _Dense(a) + _Dense(b)


def _Concat(x: tf.IndexedSlices, y: tf.IndexedSlices) -> tf.IndexedSlices:
    values = tf.concat([x.values, y.values], axis=0)
    return tf.IndexedSlices(values, tf.concat([x.indices, y.indices], 0), x.dense_shape)


def Tensors(grads: Sequence[Any]) -> list:
    """The tensors of `grads` (slices' values and indices), without None."""
    out = []
    for g in grads:
        if isinstance(g, Slices):
            out += [g.slices.values, g.slices.indices]
        elif g is not None:
            out.append(g)
    return out


def Scaled(g: Any, factor: tf.Tensor) -> Any:
    """The finished sum times `factor` (precision.Scale): a tensor, or tf.IndexedSlices."""
    if isinstance(g, Slices):
        s = g.slices
        return tf.IndexedSlices(precision.Scale(s.values, factor), s.indices, s.dense_shape)
    return precision.Scale(g, factor)


def Finished(g: Any) -> Any:
    """The sum as a gradient: a tensor, or tf.IndexedSlices."""
    return g.slices if isinstance(g, Slices) else g
