"""Profiling each cell's forward, inputs' gradient and weights' gradient on this device.

    times = cell_times.Profile(parent_p, cells, input_specs, sizes=(2, 16))

Each cell is built once, on the default device, outside any pipeline, run on its own,
fed the previous cell's outputs, and let go before the next is built (one cell's weights
in memory at a time); cells alike (the same params on inputs of the same shapes, as a
stack's repeated layers) are profiled once. Per micro-batch size n of `sizes`, per cell
and per kind (the forward, F; the forward and the gradient of its floating-point inputs;
the forward and the gradient of its weights, made dense as the executor's sum makes an
embedding's, lingpipe.pipeline.step.gradient_sums; the forward and both gradients), two
tf.functions, each traced once: one runs the kind once, the other `copies` times in a
row, each copy waiting for the last one's results, and each returns one float. Their
difference over copies - 1 is the kind as it runs inside a step, without a call's own
cost and the copying of its arguments and results (those are the action's,
cost_model.MeasureActionSeconds). I is the second kind less F, W the third less F, B
(both in one action, CellTimes.backward) the fourth less F. Each time is the median of
`repeats` (as a step's time is measured), after a warm-up; a kind that takes LONG_S or
more once is timed once (the call is under 1% of it). Per kind and cell a line
`fixed + per_example * n` through the sizes (cost_model.FitLine).
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
    "Lines",
    "Profile",
    "Resized",
    "UnitSeconds",
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


# A kind that runs this long once is timed once: a call's own cost (about 0.1 ms here)
# is under 1% of it, and four copies of a 32k softmax's forward take 1.6 s a repeat.
LONG_S = 0.02


def _Scalar(tensors: Sequence[Any]) -> Any:
    """One float from the first element of each tensor: what a timed function returns, so
    that no output is copied to the host."""
    firsts = [tf.cast(tf.reshape(t, [-1])[:1], tf.float32) for t in tensors]
    return tf.add_n([tf.reduce_sum(f) for f in firsts]) if firsts else tf.constant(0.0)


def UnitSeconds(
    run: Callable[..., Any], weights: Sequence[Any], args: tuple, repeats: int, copies: int = 4
) -> tuple[tuple[float, float, float, float], Any]:
    """((F, I, W, B) seconds of `run(*args)`, a unit of the model (a cell, a Keras layer
    call) whose trainable variables are `weights`; its outputs).

    Each kind is timed as it runs inside a step: one function runs it once, another
    `copies` times in a row (each copy waits for the last one's results), and the
    difference over copies - 1 is one run without the call, its arguments and its
    results (those are the action's, cost_model.MeasureActionSeconds). A kind that
    takes LONG_S or more once is that once."""
    weights = list(weights)
    out = run(*args)

    def Once(kind: str, inputs: tuple) -> list:
        flat = [t for t in tf.nest.flatten(inputs) if t.dtype.is_floating]
        with tf.GradientTape() as tape:
            tape.watch(flat)
            y = run(*inputs)
        ys = [o for o in tf.nest.flatten(y) if o.dtype.is_floating]
        if kind == "F" or not ys:
            return tf.nest.flatten(y)
        picked = {"I": flat, "W": weights, "B": flat + weights}[kind]
        dys = [tf.ones_like(o) for o in ys]
        grads = tape.gradient(ys, picked, output_gradients=dys) if picked else []
        return Dense([g for g in grads if g is not None]) or tf.nest.flatten(y)

    def Timed(kind: str) -> float:
        def Run(n: int) -> Callable[[], Any]:
            @tf.function(autograph=False)
            def Fn(*inputs: Any) -> Any:
                results: list = []
                kept: list = []
                for _ in range(n):
                    with tf.control_dependencies(results):
                        xs = tf.nest.map_structure(tf.identity, inputs)
                    results = Once(kind, xs)
                    kept.extend(results)
                return _Scalar(kept)

            return lambda: Fn(*args)

        one = _Median(Run(1), repeats)
        if one >= LONG_S:
            return one  # a call's own cost is under 1% of it: no copies needed
        many = _Median(Run(copies), repeats)
        return max(0.0, (many - one) / (copies - 1))

    has_floats = any(t.dtype.is_floating for t in tf.nest.flatten(args))
    t_f = Timed("F")
    t_i = Timed("I") if has_floats else t_f
    t_w = Timed("W") if weights else t_f
    t_b = Timed("B") if has_floats and weights else t_f + (t_i - t_f) + (t_w - t_f)
    return (t_f, max(0.0, t_i - t_f), max(0.0, t_w - t_f), max(0.0, t_b - t_f)), out


def Lines(sizes: Sequence[int], measured: Sequence[Sequence[tuple]]) -> cost_model.CellTimes:
    """CellTimes from UnitSeconds per unit and per size of `sizes`: per kind and unit a
    line `fixed + per_example * n` (cost_model.FitLine)."""
    kinds = [
        tuple(cost_model.FitLine(sizes, [m[kind] for m in per_size]) for per_size in measured)
        for kind in range(4)
    ]
    forward, backward_input, backward_weight, backward = kinds
    return cost_model.CellTimes(
        forward, backward_input, backward_weight, source="profile", backward=backward
    )


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
    measured = []  # per cell, (F, I, W, B) per size
    done: dict = {}  # (the cell's params, its inputs' shapes): (its per_size, its outputs)
    for i, p in enumerate(cell_params):
        p = base_layer.BaseLayer.CopyBaseParams(parent_p, p.Copy())
        key = (p.ToText(), repr([_Shapes(args[n]) for n in sizes]))
        if key not in done:
            p.name = p.name or f"profile_cell_{i}"
            cell = p.Instantiate()
            per_size, outs = [], {}
            for n in sizes:
                seconds, out = UnitSeconds(
                    lambda *a, c=cell: c.FProp(c.theta, *a),
                    cell.trainable_variables,
                    args[n],
                    repeats,
                )
                per_size.append(seconds)
                outs[n] = costs.AsArgs(out)
            done[key] = (per_size, outs)
            del cell
        per_size, outs = done[key]
        measured.append(per_size)
        args.update(outs)
    return Lines(sizes, measured)


def _Shapes(args: tuple) -> Any:
    return tf.nest.map_structure(lambda t: (tuple(t.shape), t.dtype.name), args)
