"""Profiling each cell's forward, inputs' gradient and weights' gradient on this device.

    times = cell_times.Profile(parent_p, cells, input_specs, sizes=(2, 16))

Each cell is built once, on the default device, outside any pipeline, run on its own,
fed the previous cell's outputs, and let go before the next is built (one cell's weights
in memory at a time); cells alike (the same params on inputs of the same shapes, as a
stack's repeated layers) are profiled once. Per micro-batch size n of `sizes`, per cell
and per kind (the forward, F; the forward and the gradient of its floating-point inputs;
the forward and the gradient of its weights, made dense as the executor's sum makes an
embedding's, lingpipe.pipeline.step.gradient_sums; the forward and both gradients),
tf.functions, each traced once, that run the kind `copies` times in a row, each copy
waiting for the last one's results, and return one float; and F once. F is its copies
less its one run, over copies - 1: the forward as it runs inside a step, without a
call's own cost and the copying of its arguments and results (those are the action's,
device_rates.MeasureActionSeconds). I is the second kind's copies less F's, over
copies; B (both in one action, CellTimes.backward) the fourth's. W is what a split
backward's W runs: the ops that only the weights' gradient needs, after I (the
executor holds them from I, executor.WeightOnlyOps), timed as both gradients so split
less I. The third kind's copies less F's would count twice what the two gradients
share (a MultiHeadAttention's softmax backward: the Keras classifier's ZB-V steps were
predicted 22% over their measured time so). A cell without floating-point inputs has
no I, and its W is the third kind less F. Each
difference is the median of `repeats` pairs of the two functions timed one right
after the other, after a warm-up: a slow spell of a shared machine then slows both
readings of a pair alike. A cell whose F takes LONG_S or more once is timed once per
kind (the call is under 1% of it). Per kind and cell a line
`fixed + per_example * n` through the sizes (cost_model.FitLine).

With `partner` (a second device, Partner()), each cell is also built there, and F and B
are timed once more with both copies running them at once, each on its device (B less
F run the same way): what they cost while another device computes too
(CellTimes.forward_together, backward_together). B so is not I + W: both gradients
start from the same gradient of the outputs, which one B makes once (a 32k softmax's B
together measured 19 ms where I + W came to 35 ms), and the host's threads are shared.
How much slower a cell computes beside another device depends on its size and on the
host's threads: on two CPU cores with one thread per device, the F of a 512-wide MLP's
cells took 1.8x as long beside their copies at 16 examples and 1.0x at 256; under
TensorFlow's default threads, 512 x 512 matmuls (device_rates.MeasureContention) took
1.8x. One factor for every cell cannot say both: CellTimes.Contention reads each
cell's own.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from lingpipe import base_layer, hyperparams
from lingpipe.pipeline.planning import cost_model, costs
from lingpipe.pipeline.step import executor, gradient_sums, micro_batch

__all__ = [
    "Dense",
    "Lines",
    "Partner",
    "Profile",
    "Resized",
    "TogetherSeconds",
    "UnitSeconds",
]


def _Median(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # trace and warm up
    return statistics.median(_Seconds(fn) for _ in range(repeats))


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

    Each kind is timed as it runs inside a step (_Kinds): F as `copies` runs in a row in
    one function less one run (each copy waits for the last one's results), without
    the call, its arguments and its results (those are the action's,
    device_rates.MeasureActionSeconds); I and B each as the kind's copies less F's,
    what the gradients add to the forward; W as what the weights' own ops add to I
    (the module doc). A unit whose F takes LONG_S or more once is timed once per kind."""
    out = run(*args)
    units = [(run, list(weights), args, None)]
    has_floats = any(t.dtype.is_floating for t in tf.nest.flatten(args))
    kinds = ["I"] * has_floats + ["W"] * bool(weights) + ["B"] * (has_floats and bool(weights))
    forward, beyond = _Kinds(units, kinds, repeats, copies)
    i, w = beyond.get("I", 0.0), beyond.get("W", 0.0)
    return (forward, i, w, beyond.get("B", i + w)), out


def TogetherSeconds(units: Sequence[tuple], repeats: int, copies: int = 4) -> tuple[float, float]:
    """(F, B) seconds of a unit while each of `units`, (run, weights, args, device):
    copies of one unit, each with its own weights and inputs on its device, runs it at
    once (module doc): its forward so, and its both gradients (B so less F so), each
    timed as UnitSeconds times them."""
    forward, beyond = _Kinds(units, ["B"], repeats, copies)
    return forward, beyond["B"]


def _Kinds(
    units: Sequence[tuple], kinds: Sequence[str], repeats: int, copies: int
) -> tuple[float, dict[str, float]]:
    """(F's seconds, {kind: its seconds beyond F (W: beyond I)} for `kinds` of I, W,
    B), every unit (run, weights, args, device or None) running each at once
    (UnitSeconds).

    Every difference is of two functions timed in pairs, one right after the other
    (_PairedDifference): a kind less F, not each timed on its own and subtracted
    after. A layer's B less F, so subtracted, read from 0.2 to 9 ms over four profiles
    in one process under TensorFlow's default threads; in pairs, 5 to 7 ms."""

    def Run(kind: str, n: int) -> Callable[[], Any]:
        @tf.function(autograph=False)
        def Fn(*all_args: Any) -> Any:
            kept: list = []
            for (run, weights, _, device), inputs in zip(units, all_args):
                with tf.device(device):
                    results: list = []
                    for _ in range(n):
                        with tf.control_dependencies(results):
                            xs = tf.nest.map_structure(tf.identity, inputs)
                        results = _Once(run, weights, kind, xs)
                        kept.extend(results)
            return _Scalar(kept)

        return lambda: Fn(*[args for _, _, args, _ in units])

    one = Run("F", 1)
    alone = _Median(one, repeats)
    n = 1 if alone >= LONG_S else copies  # long: a call's own cost is under 1% of it
    base = {"F": one if n == 1 else Run("F", copies)}
    if "I" in kinds:
        base["I"] = Run("I", n)

    def Beyond(kind: str) -> float:
        # W after I: what the weights' own ops add to I (_Once's "IW"); the others: what
        # they add to F.
        split = kind == "W" and "I" in kinds
        first = Run("IW", n) if split else base.get(kind) or Run(kind, n)
        second = base["I"] if split else base["F"]
        return max(0.0, _PairedDifference(first, second, repeats) / n)

    forward = alone if n == 1 else max(0.0, _PairedDifference(base["F"], one, repeats) / (n - 1))
    return forward, {k: Beyond(k) for k in kinds}


def _PairedDifference(first: Callable[[], Any], second: Callable[[], Any], repeats: int) -> float:
    """The median over `repeats` pairs of `first`'s seconds less `second`'s, timed one
    right after the other (after a call of each to trace and warm it up). A shared
    machine's slow spells last longer than a pair, so both readings of a pair see the
    same speed."""
    first()
    second()
    return statistics.median(_Seconds(first) - _Seconds(second) for _ in range(repeats))


def _Seconds(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, fn())
    return time.perf_counter() - start


def _Once(run: Callable[..., Any], weights: list, kind: str, inputs: tuple) -> list:
    """`kind` of the unit `run` once on `inputs`: its outputs (F) or its gradients: of
    the inputs (I), of the weights (W), of both (B), or of both as a split backward runs
    them (IW): the ops only the weights' gradient needs wait for the inputs' gradient,
    as the executor holds them from I for W (executor.WeightOnlyOps)."""
    flat = [t for t in tf.nest.flatten(inputs) if t.dtype.is_floating]
    with tf.GradientTape() as tape:
        tape.watch(flat)
        y = run(*inputs)
    ys = [o for o in tf.nest.flatten(y) if o.dtype.is_floating]
    if kind == "F" or not ys:
        return tf.nest.flatten(y)
    picked = {"I": flat, "W": weights, "B": flat + weights, "IW": flat + weights}[kind]
    dys = [tf.ones_like(o) for o in ys]
    split = kind == "IW" and tf.inside_function()
    graph = tf.compat.v1.get_default_graph()
    first = len(graph.get_operations()) if split else 0
    grads = tape.gradient(ys, picked, output_gradients=dys) if picked else []
    if split:
        inputs_grads = [g for g in grads[: len(flat)] if g is not None]
        weights_grads = Dense([g for g in grads[len(flat) :] if g is not None])
        done = tf.group(*inputs_grads)
        held = executor.WeightOnlyOps(
            graph.get_operations()[first:], inputs_grads, gradient_sums.Tensors(weights_grads)
        )
        for op in held:
            op._add_control_input(done)  # noqa: SLF001 (W waits for I, as in the step)
        grads = inputs_grads + weights_grads
    return Dense([g for g in grads if g is not None]) or tf.nest.flatten(y)


def Partner() -> str | None:
    """A second device of this process's kind (accelerators first) for
    backward_together, None where there is one device."""
    devices = tf.config.list_logical_devices("GPU") + tf.config.list_logical_devices("TPU")
    devices = devices or tf.config.list_logical_devices("CPU")
    return devices[1].name if len(devices) > 1 else None


def Lines(
    sizes: Sequence[int],
    measured: Sequence[Sequence[tuple]],
    together: Sequence[Sequence[float]] | None = None,
) -> cost_model.CellTimes:
    """CellTimes from UnitSeconds per unit and per size of `sizes` (and TogetherSeconds
    per unit and size, if given): per kind and unit a line `fixed + per_example * n`
    (cost_model.FitLine)."""

    def Fit(per_unit: Sequence[Sequence[Any]], kind: int) -> tuple:
        return tuple(cost_model.FitLine(sizes, [m[kind] for m in ms]) for ms in per_unit)

    forward, backward_input, backward_weight, backward = (Fit(measured, k) for k in range(4))
    return cost_model.CellTimes(
        forward,
        backward_input,
        backward_weight,
        "profile",
        backward,
        backward_together=Fit(together or (), 1),
        forward_together=Fit(together or (), 0),
    )


def Profile(
    parent_p: hyperparams.Params,
    cell_params: Sequence[hyperparams.InstantiableParams],
    input_specs: tuple,
    sizes: Sequence[int],
    batch_dim: int = 0,
    repeats: int = 5,
    partner: str | None = None,
) -> cost_model.CellTimes:
    """The cells' times (module doc); `input_specs`, the first cell's inputs for any batch
    (tf.TensorSpecs, NestedMaps of them, or shapes), are cut to each size of `sizes`;
    with `partner`, B together with a copy on that device too."""
    sizes = list(sizes)
    args = {
        n: tuple(costs._SampleInput(s) for s in Resized(input_specs, n, batch_dim))  # noqa: SLF001
        for n in sizes
    }
    measured, together = [], []  # per cell, (F, I, W, B) per size; (F, B) together per size
    done: dict = {}  # (the cell's params, its inputs' shapes): (per_size, outputs, together)
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
            both = _Together(p, cell, args, sizes, repeats, partner) if partner else []
            done[key] = (per_size, outs, both)
            del cell
        per_size, outs, both = done[key]
        measured.append(per_size)
        together.append(both)
        args.update(outs)
    return Lines(sizes, measured, together if partner else None)


def _Together(
    p: hyperparams.Params, cell: Any, args: dict, sizes: Sequence[int], repeats: int, partner: str
) -> list[tuple[float, float]]:
    """Per size, TogetherSeconds (F, B) of `cell` and a copy of it built on `partner`."""
    with tf.device(partner):
        twin = p.Copy().Set(name=f"{p.name}_partner").Instantiate()
        there = {n: tf.nest.map_structure(tf.identity, args[n]) for n in sizes}
    out = []
    for n in sizes:
        units = [
            (_FProp(cell), list(cell.trainable_variables), args[n], None),
            (_FProp(twin), list(twin.trainable_variables), there[n], partner),
        ]
        out.append(TogetherSeconds(units, repeats))
    return out


def _FProp(cell: Any) -> Callable[..., Any]:
    return lambda *a: cell.FProp(cell.theta, *a)


def _Shapes(args: tuple) -> Any:
    return tf.nest.map_structure(lambda t: (tuple(t.shape), t.dtype.name), args)
