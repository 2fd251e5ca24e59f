"""Splitting a batch into micro-batches and merging them back, for any nested structure.

A leaf is *batched* when its static size along `batch_dim` equals the batch size
(the size that most leaves share along batch_dim); it is split into M micro-batches
whose sizes differ by at most one (the first `batch % M` get one row more), so
nothing is dropped or padded. Every other leaf (scalars, per-model constants)
goes whole to every micro-batch.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf


def BatchSize(structure: Any, batch_dim: int, where: str = "pipeline") -> int:
    """The static batch size: the size along batch_dim that most tensor leaves share.

    Ties go to the leaf that comes first in tf.nest order, so a lone table or
    constant with some other size (a [1, vocab, dims] shared weight, say) never
    decides the batch, whatever its name.
    """
    sizes: list[int] = []
    for i, leaf in enumerate(tf.nest.flatten(structure)):
        if not isinstance(leaf, (tf.Tensor, tf.Variable)) or leaf.shape.rank is None:
            continue
        if leaf.shape.rank > batch_dim:
            size = leaf.shape[batch_dim]
            if size is None:
                raise ValueError(
                    f"{where}: the batch dimension (batch_dim={batch_dim}) of input leaf {i} "
                    f"is unknown at trace time (shape {leaf.shape}); the pipeline needs a "
                    f"static batch size: give tf.function an input_signature with a fixed "
                    f"batch, or use drop_remainder=True in tf.data"
                )
            sizes.append(int(size))
    if not sizes:
        raise ValueError(
            f"{where}: no input tensor has a dimension batch_dim={batch_dim} to split into "
            f"micro-batches; received {tf.nest.map_structure(Describe, structure)}"
        )
    return max(dict.fromkeys(sizes), key=sizes.count)


def Describe(x: Any) -> str:
    """A leaf for error messages: 'float32[4, 8]', or its repr."""
    return f"{x.dtype.name}{list(x.shape)}" if hasattr(x, "shape") else repr(x)


def Sizes(batch: int, num_micro_batches: int, where: str = "pipeline") -> list[int]:
    """Micro-batch sizes: as even as possible, the larger ones first."""
    if num_micro_batches < 1 or num_micro_batches > batch:
        raise ValueError(
            f"{where}: expected 1 <= num_micro_batches <= batch size, received "
            f"num_micro_batches={num_micro_batches}, batch={batch}"
        )
    base, extra = divmod(batch, num_micro_batches)
    return [base + 1 if i < extra else base for i in range(num_micro_batches)]


def IsBatched(leaf: Any, batch: int, batch_dim: int) -> bool:
    return (
        isinstance(leaf, (tf.Tensor, tf.Variable))
        and leaf.shape.rank is not None
        and leaf.shape.rank > batch_dim
        and leaf.shape[batch_dim] == batch
    )


def Split(structure: Any, sizes: list[int], batch_dim: int) -> list[Any]:
    """M structures like `structure`, batched leaves cut along batch_dim by `sizes`."""
    batch = sum(sizes)
    flat = tf.nest.flatten(structure)
    per_leaf = [
        tf.split(leaf, sizes, axis=batch_dim) if IsBatched(leaf, batch, batch_dim) else None
        for leaf in flat
    ]
    out = []
    for m in range(len(sizes)):
        leaves = [parts[m] if parts is not None else leaf for leaf, parts in zip(flat, per_leaf)]
        out.append(tf.nest.pack_sequence_as(structure, leaves))
    return out


def Merge(micro_outputs: list[Any], sizes: list[int], batch_dim: int) -> Any:
    """Inverse of Split for outputs: batched leaves concatenated in order along batch_dim.

    A leaf that is not batched in every micro-batch (a per-micro-batch scalar, say)
    is stacked into a new leading dimension of size M.
    """
    first = micro_outputs[0]
    flats = [tf.nest.flatten(o) for o in micro_outputs]
    merged = []
    for i in range(len(flats[0])):
        parts = [flat[i] for flat in flats]
        if all(IsBatched(p, s, batch_dim) for p, s in zip(parts, sizes)):
            merged.append(tf.concat(parts, axis=batch_dim))
        else:
            merged.append(tf.stack(parts))
    return tf.nest.pack_sequence_as(first, merged)


def MergeGradients(
    micro_grads: list[list], structure: Any, sizes: list[int], batch_dim: int
) -> Any:
    """The gradient of `structure`'s leaves from the gradients of its micro-batches.

    `micro_grads[m]` is aligned with tf.nest.flatten of micro-batch m's split of
    `structure`. A batched leaf's gradient is its micro-batches' concatenated; a
    leaf handed whole to every micro-batch gets their sum; None stays None.
    """
    batch = sum(sizes)
    merged = []
    for i, leaf in enumerate(tf.nest.flatten(structure)):
        parts = [grads[i] for grads in micro_grads]
        if any(g is None for g in parts):
            present = [g for g in parts if g is not None]
            merged.append(
                tf.add_n(present) if present and not IsBatched(leaf, batch, batch_dim) else None
            )
        elif IsBatched(leaf, batch, batch_dim) and len(parts) > 1:
            merged.append(tf.concat(parts, axis=batch_dim))
        else:
            merged.append(parts[0] if len(parts) == 1 else tf.add_n(parts))
    return tf.nest.pack_sequence_as(structure, merged)
