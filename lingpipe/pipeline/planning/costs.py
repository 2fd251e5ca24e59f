"""What each unit of a pipeline costs, for partitioning, the partition report and the
planner; one module for both front ends (a unit is a PipeliningLayer cell, or one call
of a Keras layer in a traced graph, lingpipe.keras.graph).

    costs.PolicyCosts('flops', n, flops=lambda: [...])   # the cost a partition balances
    times = costs.TimeUnit(call, inputs, variables)     # forward and backward seconds

Each front end says what its units' FLOPs and parameters are (FPropMeta, or the Keras
node's shapes) and how to call one; the policies, the profiler and the timing rules are
here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from lingpipe import base_layer, hyperparams
from lingpipe.nested_map import NestedMap
from lingpipe.pipeline.planning import device_rates
from lingpipe.pipeline.step import settings

__all__ = [
    "AsArgs",
    "CellMetas",
    "POLICIES",
    "PolicyCosts",
    "ProfileCells",
    "ProfileCellTimes",
    "ShapeBytes",
    "TimeUnit",
    "UnitTimes",
    "WeightCounts",
]


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


def WeightCounts(
    parent_p: hyperparams.Params, cell_params: Sequence[hyperparams.InstantiableParams]
) -> tuple[int, ...]:
    """Each cell's number of trainable variables (what the optimizer applies one by one,
    planner.ModelCosts.weight_counts). The cells are built in a graph of their own, which
    allocates no variable's memory: a model too big for this host is counted too. Cells
    alike (the same params) are built once."""
    counts, done = [], {}
    with tf.Graph().as_default():
        for i, p in enumerate(cell_params):
            child_p = base_layer.BaseLayer.CopyBaseParams(parent_p, p.Copy())
            child_p.name = child_p.name or f"count_cell_{i}"
            key = child_p.ToText()
            if key not in done:
                done[key] = len(child_p.Instantiate().trainable_variables)
            counts.append(done[key])
    return tuple(counts)


def ShapeBytes(shapes: Any, dtype: tf.DType = tf.float32) -> int:
    """Bytes of tensors of these (fully known) shapes; unknown dims count as 1."""
    known = [s for s in tf.nest.flatten(shapes) if isinstance(s, tf.TensorShape)]
    return sum(math.prod(1 if d is None else d for d in s.as_list()) * dtype.size for s in known)


# The partition policies both front ends accept (besides explicit counts per stage).
POLICIES = settings.PARTITION_POLICIES


@dataclasses.dataclass(frozen=True)
class UnitTimes:
    """Seconds of one unit on a sample batch: its forward, and its backward (the input
    and weight gradients together, the forward it needs excluded)."""

    forward: float
    backward: float

    @property
    def total(self) -> float:
        return self.forward + self.backward


def PolicyCosts(
    policy: str,
    num_units: int,
    flops: Callable[[], Sequence[float]] | None = None,
    params: Callable[[], Sequence[float]] | None = None,
    profile: Callable[[], Sequence[UnitTimes]] | None = None,
) -> list[float]:
    """Each unit's cost under a partition `policy` (POLICIES): 'uniform' 1 each, 'flops'
    and 'params' the front end's counts per unit, 'profile' the measured forward +
    backward seconds per unit. Only the callable the policy needs is called."""
    source = {"flops": flops, "params": params, "profile": profile}.get(policy)
    if policy == "uniform":
        return [1.0] * num_units
    if policy not in POLICIES or source is None:
        raise ValueError(
            f"partition policy {policy!r}: expected one of {POLICIES} with its costs given"
        )
    values = list(source())
    if len(values) != num_units:
        raise ValueError(
            f"partition policy {policy!r}: expected {num_units} costs, one per unit, "
            f"received {len(values)}"
        )
    if policy == "profile":
        return [t.total for t in values]
    return [float(v) for v in values]


def _Floats(structure: Any) -> list:
    return [t for t in tf.nest.flatten(structure) if t.dtype.is_floating]


def TimeUnit(
    call: Callable[..., Any], inputs: tuple, variables: Sequence[Any], repeats: int = 3
) -> tuple[UnitTimes, Any]:
    """Times one unit: `call(*inputs)` as a tf.function, then the same forward with the
    gradients of its float outputs' sum with respect to its float inputs and
    `variables` (what a pipeline's backward computes); the best of `repeats` runs of
    each, after one to trace and warm up. Returns (UnitTimes, the outputs): backward is
    the forward-and-backward time less the forward's, at least 0."""

    @tf.function
    def Forward(*args: Any) -> Any:
        return call(*args)

    @tf.function
    def ForwardBackward(*args: Any) -> Any:
        floats = _Floats(args)
        with tf.GradientTape() as tape:
            tape.watch(floats)
            out = call(*args)
            loss = tf.add_n([tf.reduce_sum(o) for o in _Floats(out)] or [tf.constant(0.0)])
        return tape.gradient(loss, list(variables) + floats, unconnected_gradients="zero")

    def Waited(fn: Callable[..., Any]) -> Callable[[], Any]:
        return lambda: tf.nest.map_structure(lambda t: t.numpy(), fn(*inputs))

    outputs = Forward(*inputs)
    forward = device_rates.Best(Waited(Forward), repeats)  # each traced and warmed up first
    both = device_rates.Best(Waited(ForwardBackward), repeats)
    return UnitTimes(forward, max(both - forward, 0.0)), outputs


def _SampleInput(spec: Any) -> Any:
    if isinstance(spec, dict):
        return NestedMap({k: _SampleInput(v) for k, v in spec.items()})
    if not isinstance(spec, tf.TensorSpec):
        spec = tf.TensorSpec(spec, tf.float32)
    if spec.dtype.is_floating:
        return tf.random.stateless_normal(spec.shape, [0, 1], dtype=spec.dtype)
    return tf.zeros(spec.shape, spec.dtype)


def ProfileCellTimes(
    parent_p: hyperparams.Params,
    cell_params: Sequence[hyperparams.InstantiableParams],
    input_specs: tuple,
    repeats: int = 3,
) -> list[UnitTimes]:
    """Each cell's forward and backward seconds on a sample batch (TimeUnit), each fed
    the previous one's outputs; builds every cell once, on the default device, outside
    the pipeline's tree."""
    args = tuple(_SampleInput(s) for s in input_specs)
    times = []
    for i, p in enumerate(cell_params):
        p = base_layer.BaseLayer.CopyBaseParams(parent_p, p.Copy())
        p.name = p.name or f"profile_cell_{i}"
        cell = p.Instantiate()
        t, out = TimeUnit(cell, args, cell.trainable_variables, repeats)
        times.append(t)
        args = AsArgs(out)
    return times


def ProfileCells(
    parent_p: hyperparams.Params,
    cell_params: Sequence[hyperparams.InstantiableParams],
    input_specs: tuple,
    repeats: int = 3,
) -> list[float]:
    """Seconds of forward + backward of each cell on a sample batch (ProfileCellTimes)."""
    return [t.total for t in ProfileCellTimes(parent_p, cell_params, input_specs, repeats)]
