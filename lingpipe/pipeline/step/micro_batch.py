"""Splitting a batch into micro-batches and merging them back, for any nested structure.

The batch is the size along `batch_dim` that most tensor leaves share; when that
size is unknown at trace time (a `tf.function` with batch None, the partial last
batch of an epoch, a replica's share under tf.distribute) it is a scalar int32
tensor read at run time. A leaf is *batched* when its size along batch_dim is the
batch's or unknown (an unknown size is presumed to be the batch): it is split into
M micro-batches whose sizes differ by at most one (the first `batch % M` get one
row more), so nothing is dropped or padded. Every other leaf (scalars, per-model
constants with a static size) goes whole to every micro-batch.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

__all__ = [
    "BatchSize",
    "Describe",
    "IsBatched",
    "Merge",
    "MergeGradients",
    "PadToMicroBatches",
    "Size",
    "Sizes",
    "Split",
    "SplitLike",
]

Size = int | tf.Tensor  # a static size, or a scalar int32 tensor known at run time


def _HasDim(leaf: Any, batch_dim: int) -> bool:
    """Whether `leaf` is a tensor (or a tf.TensorSpec, for the memory estimate) of known
    rank with a dimension batch_dim."""
    is_tensor = isinstance(leaf, (tf.Tensor, tf.Variable, tf.TensorSpec))
    return is_tensor and (leaf.shape.rank or 0) > batch_dim  # rank None: unknown


def BatchSize(structure: Any, batch_dim: int, where: str = "pipeline") -> Size:
    """The size along batch_dim that most tensor leaves share (module doc); ties go to
    the leaf first in tf.nest order, so a lone table or constant with some other size
    (a [1, vocab, dims] shared weight, say) never decides the batch, whatever its name.
    An unknown deciding size is `tf.shape(leaf)[batch_dim]` of the first such leaf."""
    leaves = [leaf for leaf in tf.nest.flatten(structure) if _HasDim(leaf, batch_dim)]
    if not leaves:
        raise ValueError(
            f"{where}: no input tensor has a dimension batch_dim={batch_dim} to split into "
            f"micro-batches; received {tf.nest.map_structure(Describe, structure)}"
        )
    sizes = [leaf.shape[batch_dim] for leaf in leaves]
    size = max(dict.fromkeys(sizes), key=sizes.count)
    if size is not None:
        return int(size)
    leaf = next(leaf for leaf in leaves if leaf.shape[batch_dim] is None)
    if isinstance(leaf, tf.TensorSpec):  # nothing to read at run time
        raise ValueError(f"{where}: expected a static batch size, received {structure}")
    return tf.shape(leaf, out_type=tf.int32)[batch_dim]


def Describe(x: Any) -> str:
    """A leaf for error messages: 'float32[4, 8]', or its repr."""
    return f"{x.dtype.name}{list(x.shape)}" if hasattr(x, "shape") else repr(x)


def PadToMicroBatches(inputs: Any, batch: Size, num_micro_batches: int) -> Any:
    """`inputs` ([batch, ...] leaves) with at least num_micro_batches rows: a smaller batch
    gets its last row repeated, so each real row is a micro-batch of its own (for
    inference, where rows do not meet; cut the outputs back to `batch` rows)."""
    rows = tf.minimum(tf.range(tf.maximum(batch, num_micro_batches)), batch - 1)
    return tf.nest.map_structure(lambda x: tf.gather(x, rows), inputs)


def Sizes(batch: Size, num_micro_batches: int, where: str = "pipeline") -> list[Size]:
    """Micro-batch sizes (module doc): Python ints for a static batch; for a batch known
    only at run time, M scalar int32 tensors, after a run-time check that batch >= M."""
    if num_micro_batches < 1 or (isinstance(batch, int) and num_micro_batches > batch):
        raise ValueError(
            f"{where}: expected 1 <= num_micro_batches <= batch size, received "
            f"num_micro_batches={num_micro_batches}, batch={batch}"
        )
    if isinstance(batch, int):
        base, extra = divmod(batch, num_micro_batches)
        return [base + 1 if i < extra else base for i in range(num_micro_batches)]
    message = tf.strings.format(
        f"{where}: batch {{}} is smaller than num_micro_batches={num_micro_batches}; give "
        f"batches of at least {num_micro_batches} rows or lower num_micro_batches",
        batch,
    )
    check = tf.debugging.Assert(batch >= num_micro_batches, [message], summarize=1)
    with tf.control_dependencies([check]):
        batch = tf.identity(batch)
    base, extra = batch // num_micro_batches, batch % num_micro_batches
    return [base + tf.cast(i < extra, tf.int32) for i in range(num_micro_batches)]


def IsBatched(leaf: Any, batch: Size, batch_dim: int) -> bool:
    """Whether `leaf` has the batch along batch_dim: its static size is `batch`, or unknown."""
    if not _HasDim(leaf, batch_dim):
        return False
    size = leaf.shape[batch_dim]
    return size is None or (isinstance(batch, int) and size == batch)


def _Total(sizes: list[Size]) -> Size:
    return sum(sizes) if all(isinstance(s, int) for s in sizes) else tf.add_n(sizes)


def Split(structure: Any, sizes: list[Size], batch_dim: int) -> list[Any]:
    """M structures like `structure`, batched leaves cut along batch_dim by `sizes`."""
    if len(sizes) == 1:
        return [structure]
    batch = _Total(sizes)
    splits = sizes if isinstance(batch, int) else tf.stack(sizes)
    per_leaf = [
        tf.split(leaf, splits, num=len(sizes), axis=batch_dim)
        if IsBatched(leaf, batch, batch_dim)
        else [leaf] * len(sizes)
        for leaf in tf.nest.flatten(structure)
    ]
    return [
        tf.nest.pack_sequence_as(structure, [p[m] for p in per_leaf]) for m in range(len(sizes))
    ]


def Merge(micro_outputs: list[Any], sizes: list[Size], batch_dim: int) -> Any:
    """Inverse of Split for outputs: batched leaves concatenated in order along batch_dim;
    a leaf not batched in every micro-batch (a per-micro-batch scalar, say) is stacked
    into a new leading dimension of size M."""
    merged = []
    for parts in zip(*[tf.nest.flatten(o) for o in micro_outputs]):
        batched = all(IsBatched(p, s, batch_dim) for p, s in zip(parts, sizes))
        merged.append(tf.concat(parts, axis=batch_dim) if batched else tf.stack(parts))
    return tf.nest.pack_sequence_as(micro_outputs[0], merged)


def SplitLike(merged: Any, micro_outputs: list[Any], sizes: list[Size], batch_dim: int) -> list:
    """Inverse of Merge (for the gradient of merged outputs): M structures like
    `micro_outputs`, a concatenated leaf cut by `sizes`, a stacked one unstacked."""
    if len(sizes) == 1:  # nothing was merged
        return [tf.nest.pack_sequence_as(micro_outputs[0], tf.nest.flatten(merged))]
    flats = [tf.nest.flatten(o) for o in micro_outputs]
    splits = sizes if all(isinstance(s, int) for s in sizes) else tf.stack(sizes)
    parts = []
    for i, leaf in enumerate(tf.nest.flatten(merged)):
        if leaf is None:
            parts.append([None] * len(sizes))
        elif all(IsBatched(f[i], s, batch_dim) for f, s in zip(flats, sizes)):
            parts.append(tf.split(leaf, splits, num=len(sizes), axis=batch_dim))
        else:
            parts.append(tf.unstack(leaf, num=len(sizes)))
    return [
        tf.nest.pack_sequence_as(micro_outputs[m], [p[m] for p in parts]) for m in range(len(sizes))
    ]


def MergeGradients(
    micro_grads: list[list], structure: Any, sizes: list[Size], batch_dim: int
) -> Any:
    """The gradient of `structure`'s leaves from its micro-batches' (`micro_grads[m]`
    aligned with tf.nest.flatten of micro-batch m's split of `structure`): a batched
    leaf's gradient is theirs concatenated, a leaf handed whole to every micro-batch
    gets their sum; None stays None."""
    if len(sizes) == 1:  # nothing was split
        return tf.nest.pack_sequence_as(structure, list(micro_grads[0]))
    batch = _Total(sizes)
    merged = []
    for leaf, parts in zip(tf.nest.flatten(structure), zip(*micro_grads)):
        present = [g for g in parts if g is not None]
        if IsBatched(leaf, batch, batch_dim):
            merged.append(tf.concat(parts, axis=batch_dim) if len(present) == len(parts) else None)
        else:
            merged.append(tf.add_n(present) if present else None)
    return tf.nest.pack_sequence_as(structure, merged)
