"""What each cell costs, for partitioning and the partition report."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from lingpipe import base_layer, hyperparams
from lingpipe.nested_map import NestedMap


def AsArgs(outputs: Any) -> tuple:
    """The positional arguments that a cell's outputs become for the next cell."""
    return outputs if isinstance(outputs, tuple) else (outputs,)


def CellMetas(
    parent_p: hyperparams.Params,
    cell_params: Sequence[hyperparams.InstantiableParams],
    input_shapes: tuple,
) -> list[NestedMap]:
    """Each cell's FPropMeta, fed the previous one's out_shapes (nothing is built): one
    NestedMap per cell with flops, num_params, in_shapes, out_shapes."""
    shapes = tuple(base_layer.NormShape(s) for s in input_shapes)
    metas = []
    for i, p in enumerate(cell_params):
        # The cell as the parent builds it: it inherits the parent's base params.
        child_p = base_layer.BaseLayer.CopyBaseParams(parent_p, p.Copy())
        meta = child_p.cls.FPropMeta(child_p, *shapes)
        if meta is None:
            raise ValueError(f"cell {i} ({p.cls.__name__}) FPropMeta returned nothing")
        metas.append(NestedMap(flops=meta.flops, num_params=meta.num_params, in_shapes=shapes))
        shapes = tuple(meta.out_shapes)
        metas[-1].out_shapes = shapes
    return metas


def ShapeBytes(shapes: Any, dtype: tf.DType = tf.float32) -> int:
    """Bytes of tensors of these (fully known) shapes; unknown dims count as 1."""
    known = [s for s in tf.nest.flatten(shapes) if isinstance(s, tf.TensorShape)]
    return sum(math.prod(1 if d is None else d for d in s.as_list()) * dtype.size for s in known)


def _SampleInput(spec: Any) -> Any:
    if isinstance(spec, dict):
        return NestedMap({k: _SampleInput(v) for k, v in spec.items()})
    if not isinstance(spec, tf.TensorSpec):
        spec = tf.TensorSpec(spec, tf.float32)
    if spec.dtype.is_floating:
        return tf.random.stateless_normal(spec.shape, [0, 1], dtype=spec.dtype)
    return tf.zeros(spec.shape, spec.dtype)


def ProfileCells(
    parent_p: hyperparams.Params,
    cell_params: Sequence[hyperparams.InstantiableParams],
    input_specs: tuple,
    repeats: int = 3,
) -> list[float]:
    """Seconds of forward + backward of each cell on a sample batch (best of `repeats`);
    builds every cell once, on the default device, outside the pipeline's tree."""
    args = tuple(_SampleInput(s) for s in input_specs)
    seconds = []
    for i, p in enumerate(cell_params):
        p = base_layer.BaseLayer.CopyBaseParams(parent_p, p.Copy())
        p.name = p.name or f"profile_cell_{i}"
        cell = p.Instantiate()

        @tf.function
        def Step(*inputs, cell=cell):
            floats = [t for t in tf.nest.flatten(inputs) if t.dtype.is_floating]
            with tf.GradientTape() as tape:
                tape.watch(floats)
                out = cell(*inputs)
                sums = [tf.reduce_sum(o) for o in tf.nest.flatten(out) if o.dtype.is_floating]
                loss = tf.add_n(sums or [tf.constant(0.0)])
            return out, tape.gradient(loss, cell.trainable_variables or floats)

        out, _ = Step(*args)  # trace and warm up
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            tf.nest.map_structure(lambda t: t.numpy(), Step(*args))
            best = min(best, time.perf_counter() - start)
        seconds.append(best)
        args = AsArgs(out)
    return seconds
