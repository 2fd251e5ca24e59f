"""A traced graph's ops walked in order: what their tensors hold at once, in bytes.

The memory estimate (lingpipe.pipeline.observe.memory) walks each cell's backward with
`Transients`, and the optimizer's update (lingpipe.pipeline.observe.update_memory)
walks the update's ops. Views (Reshape, Identity, ...) cost what their source costs
(`Source`); an element-wise op that reads an input last writes into its buffer, as
TensorFlow's kernels do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

__all__ = ["Bytes", "NO_BUFFER", "NOT_ACTIVATIONS", "Source", "Transients", "VIEW_OPS"]

# Ops whose output shares its input's buffer: a saved view costs what its source costs.
VIEW_OPS = frozenset({"Reshape", "Identity", "ExpandDims", "Squeeze", "StopGradient", "Snapshot"})
# Saved tensors that are not activations: the weights, constants.
NOT_ACTIVATIONS = frozenset({"ReadVariableOp", "Const", "VarHandleOp"})


def Bytes(t: Any) -> int:
    """A tensor's bytes where its shape is known; 0 for handles and unknown shapes."""
    if t.dtype in (tf.resource, tf.variant, tf.string):
        return 0
    n = t.shape.num_elements() if t.shape.is_fully_defined() else None
    return (n or 0) * t.dtype.size


def Source(t: tf.Tensor) -> tf.Tensor:
    """The tensor whose buffer `t` views (itself if it is not a view). IdentityN (the
    op of tf.custom_gradient and of Keras' optimizers) views each input as its output
    of the same position."""
    while t.op.inputs:
        if t.op.type in VIEW_OPS:
            t = t.op.inputs[0]
        elif t.op.type == "IdentityN":
            t = t.op.inputs[t.value_index]
        else:
            break
    return t


# Ops that make no buffer of their own for the walk: views, weights, constants, inputs.
NO_BUFFER = VIEW_OPS | NOT_ACTIVATIONS | {"Placeholder", "IdentityN"}


# Kernels that copy their operands while they run: TensorFlow's Einsum transposes an
# operand whose contracted dimensions are not where a batched matmul reads them, into a
# buffer of its own held until the op returns (measured on the Keras transformer's
# attention gradients: two such copies beside the output of one Einsum).
_SCRATCH_OPS = frozenset({"Einsum"})


def _Scratch(op: Any) -> int:
    """Bytes an op holds while it runs beyond its outputs: its operands' copies, at most."""
    if op.type not in _SCRATCH_OPS:
        return 0
    return sum(Bytes(Source(x)) for x in op.inputs)


def Transients(
    ops: Sequence[Any],
    kept: set,
    skip: Any = frozenset(),
    held: Sequence[Any] = (),
    received: Sequence[Any] = (),
) -> tuple[int, int]:
    """(the most bytes alive at once, the bytes alive at the end), beyond `held`, as
    `ops` run in their order (graph order: every op after its inputs' ops): a
    backward's transients. The end can be below 0: `held` tensors freed.

    Each tensor that `ops` make is alive from its op to its last reader among `ops`
    (views resolved), those in `kept` (refs) to the end. `held`: tensors alive before
    (a backward's saved activations, counted elsewhere): freed by their last reader, or
    passing their buffer on. `received`: tensors alive before and counted (the
    outputs' gradients). Tensors made by the ops in `skip` are not counted, nor ops
    whose outputs nothing reads (TensorFlow prunes them). An op that makes a tensor of
    the shape and dtype of an input whose last reader it is writes into that input's
    buffer, as TensorFlow's element-wise kernels do (forward_input_or_allocate_output):
    the buffer passes on, nothing is added. An Einsum holds copies of its operands
    while it runs (_Scratch): they count at its moment, not after."""
    read = [[Source(x) for x in op.inputs] for op in ops]  # each op's inputs, views resolved
    last = {}
    for i, sources in enumerate(read):
        for t in sources:
            last[t.ref()] = i
    size = {Source(t).ref(): Bytes(Source(t)) for t in list(held) + list(received)}
    start = sum(Bytes(Source(t)) for t in held)
    live = peak = sum(size.values())
    for i, op in enumerate(ops):
        outputs = [(t, t.ref()) for t in op.outputs]
        used = any(r in last or r in kept for _, r in outputs)
        scratch = 0
        if used and op.type not in NO_BUFFER and op not in skip:
            scratch = _Scratch(op)
            # Inputs this op reads last, not kept: their buffers can pass to its outputs.
            spare = [x for x in read[i] if x.ref() in size and last[x.ref()] == i]
            spare = [x for x in spare if x.ref() not in kept]
            for t, r in outputs:
                if r in size or not Bytes(t):
                    continue
                same = [j for j, x in enumerate(spare) if (x.dtype, x.shape) == (t.dtype, t.shape)]
                if same:  # in place: the input's buffer becomes the output's
                    size[r] = size.pop(spare.pop(same[0]).ref())
                else:
                    size[r] = Bytes(t)
                    live += size[r]
        peak = max(peak, live + scratch)
        for r in [r for _, r in outputs] + [x.ref() for x in read[i]]:
            if r in size and last.get(r, i) <= i and r not in kept:
                live -= size.pop(r)
    return peak - start, live - start
