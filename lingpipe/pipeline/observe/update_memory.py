"""What an optimizer's update holds at once, beyond the weights, slots and gradients.

A training step ends with the optimizer's update of every trainable variable, after the
last backward: the activations are freed by then, but the update makes tensors of its
own, and a variable whose gradient is slices (an embedding's, as a Keras pipeline sums
it) is made dense there. Keras' Adam does it twice, once for m and once for v: on
keras.io's text classifier (a 20,000 x 128 table, batch 32 x 500 tokens) the update
held two dense tables and the squared slices beside the gradient's own slices, 27 MiB
above the weights and slots, and that was the step's peak.

`UpdateCostOf(optimizer)` traces the optimizer's update on one probe variable (traced,
never run: nothing is allocated) and walks its ops (op_walk.Transients), as:

- per byte of a variable with a dense gradient;
- per byte of a variable with a gradient of slices, plus per byte of the slices.

TensorFlow runs the update's independent branches at once (Adam's for m and for v, on
the host's inter-op threads): each op that reads the gradient starts a branch, and the
update holds the larger of the walk in graph order and every branch's own peak
together. The estimate (lingpipe.pipeline.observe.memory) adds each stage's largest
variable update at the step's end, when the devices' applies run side by side.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from lingpipe.pipeline.observe import op_walk

__all__ = ["UpdateCost", "UpdateCostOf", "UpdateTransient"]

# Ops that write a variable: a branch of the update ends where it writes.
_WRITES = frozenset({
    "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
    "ResourceScatterAdd", "ResourceScatterSub", "ResourceScatterUpdate",
    "ResourceScatterMul", "ResourceScatterDiv", "ResourceScatterMax", "ResourceScatterMin",
})  # fmt: skip

# The probe: a table of ROWS x WIDTH float32, its slices LOOKUPS rows (two sizes: the
# slices' share is the difference).
_ROWS, _WIDTH, _LOOKUPS = 1024, 32, (64, 256)


@dataclasses.dataclass(frozen=True)
class UpdateCost:
    """An update's transient bytes per byte: `dense` of a variable with a dense gradient;
    `table` of a variable with a gradient of slices, plus `values` of those slices."""

    dense: float = 0.0
    table: float = 0.0
    values: float = 0.0

    def Bytes(self, variable_bytes: int, slice_bytes: int | None = None) -> int:
        """A variable's update: dense where `slice_bytes` is None, else of slices."""
        if slice_bytes is None:
            return int(self.dense * variable_bytes)
        return int(self.table * variable_bytes + self.values * slice_bytes)


def UpdateTransient(ops: Sequence[Any], gradients: Sequence[Any]) -> int:
    """The most the update's `ops` (in graph order) hold at once beyond `gradients` (the
    gradient's tensors, counted elsewhere): the walk in order, or its branches together,
    whichever holds more (module doc)."""
    walked = op_walk.Transients(ops, set(), held=gradients)[0]
    mine, sources = set(ops), {op_walk.Source(g).ref() for g in gradients}
    starts = [
        op for op in ops
        if op.type not in op_walk.NO_BUFFER
        and any(op_walk.Source(x).ref() in sources for x in op.inputs)
    ]  # fmt: skip
    branches = 0
    for start in starts:
        branch, todo = {start}, [start]
        while todo:  # its readers, up to the variables' writes (included: they read)
            for y in todo.pop().outputs:
                for reader in y.consumers():
                    if reader in mine and reader not in branch:
                        branch.add(reader)
                        todo += [] if reader.type in _WRITES else [reader]
        branches += op_walk.Transients([op for op in ops if op in branch], set())[0]
    return max(walked, branches)


def _Probe(optimizer: keras.optimizers.Optimizer, lookups: int | None) -> int:
    """UpdateTransient of a fresh copy of `optimizer` updating the probe table, its
    gradient dense (lookups None) or `lookups` slices."""
    probe = type(optimizer).from_config(optimizer.get_config())
    table = keras.Variable(np.zeros((_ROWS, _WIDTH), "float32"), name="update_probe")
    probe.build([table])
    found: dict = {}

    def Update(values: tf.Tensor, indices: tf.Tensor) -> int:
        graph = tf.compat.v1.get_default_graph()
        before = set(graph.get_operations())
        g = (
            values
            if lookups is None
            else tf.IndexedSlices(values, indices, tf.constant([_ROWS, _WIDTH]))
        )
        probe.apply([g], [table])
        found.update(ops=[op for op in graph.get_operations() if op not in before], values=values)
        return 0

    rows = _ROWS if lookups is None else lookups
    specs = tf.TensorSpec((rows, _WIDTH), tf.float32), tf.TensorSpec((rows,), tf.int32)
    tf.function(Update, autograph=False).get_concrete_function(*specs)
    return UpdateTransient(found["ops"], [found["values"]])


_COSTS: dict = {}  # (class, config) -> UpdateCost: the planner asks once per candidate


def _Cost(optimizer: keras.optimizers.Optimizer) -> UpdateCost:
    key = (type(optimizer), json.dumps(optimizer.get_config(), sort_keys=True, default=str))
    if key not in _COSTS:
        table = _ROWS * _WIDTH * 4
        small, large, dense = (_Probe(optimizer, n) for n in (*_LOOKUPS, None))
        values = max(0.0, (large - small) / ((_LOOKUPS[1] - _LOOKUPS[0]) * _WIDTH * 4))
        sliced = max(0.0, (small - values * _LOOKUPS[0] * _WIDTH * 4) / table)
        _COSTS[key] = UpdateCost(dense=dense / table, table=sliced, values=values)
    return _COSTS[key]


# A number of slots per weight stands for the Keras optimizer that keeps that many.
_BY_SLOTS = {0: lambda: keras.optimizers.SGD(), 1: lambda: keras.optimizers.SGD(momentum=0.9)}


def UpdateCostOf(optimizer: Any, where: str = "memory estimate") -> UpdateCost:
    """The UpdateCost of `optimizer`: a Keras optimizer; the params or instance of a
    lingpipe.optimizers class (its Keras optimizer); a number of slots per weight (0:
    SGD's update, 1: SGD with momentum's, more: Adam's); None: no update (0). A
    loss-scale optimizer: its inner optimizer's (the gradients' scaled copies that
    mixed_float16 makes around it are left out)."""
    if optimizer is None:
        return UpdateCost()
    if isinstance(optimizer, (int, float)) and not isinstance(optimizer, bool):
        optimizer = _BY_SLOTS.get(int(optimizer), lambda: keras.optimizers.Adam())()
    if hasattr(optimizer, "Instantiate"):
        optimizer = optimizer.Instantiate()
    optimizer = getattr(optimizer, "keras_optimizer", optimizer)
    # A loss-scale optimizer updates in a tf.cond the walk does not enter: its inner
    # optimizer's update is counted, not the scaled copies of the gradients around it.
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(
            f"{where}: expected optimizer to be a Keras optimizer, lingpipe.optimizers "
            f"params or a number of slots per weight, received {type(optimizer).__name__}"
        )
    try:
        # Eager, whatever graph or tf.function asks (a report built while tracing): the
        # optimizer's config reads its learning rate, and the probe builds a variable.
        with tf.init_scope():
            return _Cost(optimizer)
    except Exception as e:  # noqa: BLE001 (whatever an optimizer's own update raises)
        raise ValueError(
            f"{where}: cannot trace the update of optimizer {type(optimizer).__name__} "
            f"({type(e).__name__}); pass optimizer= a number of slots per weight (Adam: 2)"
        ) from None
