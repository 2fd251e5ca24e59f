"""Profiling each cell's forward, inputs' gradient and weights' gradient on this device.

    times = cell_times.Profile(parent_p, cells, input_specs, sizes=(2, 16))

Each cell is built once, on the default device, outside any pipeline, run on its own,
fed the previous cell's outputs, and let go before the next is built (one cell's
weights in memory at a time). Per micro-batch size n of `sizes` and per cell, four
tf.functions, each traced once: the forward (F); the forward and the gradient of its
floating-point inputs; the forward and the gradient of its weights, made dense as the
executor's sum makes an embedding's (lingpipe.pipeline.step.gradient_sums); an empty call
with the same inputs. I is the second less F, W the third less F, F itself less the
empty call (a call's own cost is the action's, cost_model.MeasureActionSeconds). Each
time is the median of `repeats` (as a step's time is measured), after a warm-up; per
kind and cell a line `fixed + per_example * n` through the sizes (cost_model.FitLine).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from lingpipe import base_layer, hyperparams
from lingpipe.pipeline.planning import cost_model, costs
from lingpipe.pipeline.step import micro_batch

__all__ = [
    "Dense",
    "Profile",
    "Resized",
]


def _Median(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # trace and warm up
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, fn())
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def Dense(grads: Sequence[Any]) -> list:
    """The gradients as the executor sums them: an embedding's tf.IndexedSlices dense."""
    return [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]


def Resized(specs: tuple, n: int, batch_dim: int = 0) -> tuple:
    """`specs` (tf.TensorSpecs or shapes of a whole batch) with the batch dimension n."""
    whole = tuple(_AsSpec(s) for s in specs)
    batch = micro_batch.BatchSize(whole, batch_dim, "cell profile")

    def Cut(s: tf.TensorSpec) -> tf.TensorSpec:
        if not micro_batch.IsBatched(s, batch, batch_dim):
            return s
        dims = s.shape.as_list()
        dims[batch_dim] = n
        return tf.TensorSpec(dims, s.dtype)

    return tf.nest.map_structure(Cut, whole)


def _AsSpec(x: Any, key: str = "") -> Any:
    if isinstance(x, dict):
        return type(x)({k: _AsSpec(v, k) for k, v in x.items()})
    if isinstance(x, tf.TensorSpec):
        return x
    dtype = tf.int32 if key.endswith(("ids", "labels")) else tf.float32
    return tf.TensorSpec(base_layer.ToShape(x), dtype)


def _CellSeconds(cell: Any, args: tuple, repeats: int) -> tuple[tuple[float, float, float], Any]:
    """((F, I, W) seconds of `cell` on `args`, its outputs)."""
    floats = [t for t in tf.nest.flatten(args) if t.dtype.is_floating]
    weights = list(cell.trainable_variables)
    out = cell.FProp(cell.theta, *args)
    dys = [tf.ones_like(o) for o in tf.nest.flatten(out) if o.dtype.is_floating]

    def Grad(sources: list) -> Callable[[], Any]:
        @tf.function(autograph=False)
        def Fn(*inputs: Any) -> Any:
            flat = [t for t in tf.nest.flatten(inputs) if t.dtype.is_floating]
            with tf.GradientTape() as tape:
                tape.watch(flat)
                y = cell.FProp(cell.theta, *inputs)
            ys = [o for o in tf.nest.flatten(y) if o.dtype.is_floating]
            picked = flat if sources is floats else weights
            grads = tape.gradient(ys, picked, output_gradients=dys) if ys and picked else []
            return Dense([g for g in grads if g is not None]) or [tf.constant(0.0)]

        return lambda: Fn(*args)

    forward = tf.function(lambda *xs: cell.FProp(cell.theta, *xs), autograph=False)
    empty = tf.function(lambda *xs: tf.nest.flatten(xs)[0], autograph=False)
    t_empty = _Median(lambda: empty(*args), repeats)
    t_f = _Median(lambda: forward(*args), repeats)
    t_i = _Median(Grad(floats), repeats) if floats else t_f
    t_w = _Median(Grad(weights), repeats) if weights else t_f
    return (max(0.0, t_f - t_empty), max(0.0, t_i - t_f), max(0.0, t_w - t_f)), out


def Profile(
    parent_p: hyperparams.Params,
    cell_params: Sequence[hyperparams.InstantiableParams],
    input_specs: tuple,
    sizes: Sequence[int],
    batch_dim: int = 0,
    repeats: int = 5,
) -> cost_model.CellTimes:
    """The cells' times (module doc); `input_specs`, the first cell's inputs for any batch
    (tf.TensorSpecs, NestedMaps of them, or shapes), are cut to each size of `sizes`."""
    sizes = list(sizes)
    args = {
        n: tuple(costs._SampleInput(s) for s in Resized(input_specs, n, batch_dim))  # noqa: SLF001
        for n in sizes
    }
    lines: list[list] = [[], [], []]  # per kind (F, I, W), one line per cell
    for i, p in enumerate(cell_params):
        p = base_layer.BaseLayer.CopyBaseParams(parent_p, p.Copy())
        p.name = p.name or f"profile_cell_{i}"
        cell = p.Instantiate()
        measured = []  # (F, I, W) per size
        for n in sizes:
            seconds, out = _CellSeconds(cell, args[n], repeats)
            measured.append(seconds)
            args[n] = costs.AsArgs(out)
        for kind in range(3):
            lines[kind].append(cost_model.FitLine(sizes, [m[kind] for m in measured]))
        del cell
    return cost_model.CellTimes(*(tuple(x) for x in lines), source="profile")
