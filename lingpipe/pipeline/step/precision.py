"""Mixed precision in the pipeline: compute dtypes, and sums kept in float32.

A pipeline computes in its cells' `fprop_dtype` (bfloat16 or float16) while the
weights stay float32 (the "master" copy the optimizer updates): each cell casts
a weight to the compute dtype where it uses it, so the activations that cross
stage boundaries, and the gradients flowing back between stages, are in the
compute dtype, and the gradient of a weight comes out of the cast in float32.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

__all__ = [
    "COMPUTE_DTYPES",
    "ComputeDtype",
    "ForAccumulation",
    "IsNarrow",
    "Scale",
]

# What --precision and the task's params accept, by name.
COMPUTE_DTYPES = {"float32": tf.float32, "bfloat16": tf.bfloat16, "float16": tf.float16}


def ComputeDtype(name: Any) -> tf.DType:
    """The tf.DType of a compute precision given by name ('bfloat16') or dtype."""
    key = name.name if isinstance(name, tf.DType) else name
    if isinstance(key, str) and key in COMPUTE_DTYPES:
        return COMPUTE_DTYPES[key]
    raise ValueError(
        f"Received an invalid precision, expected one of {sorted(COMPUTE_DTYPES)}. "
        f"Received: precision={name!r}"
    )


def IsNarrow(dtype: tf.DType) -> bool:
    """Whether `dtype` is a floating dtype of fewer than 32 bits (bfloat16, float16)."""
    return dtype.is_floating and dtype.size < 4


def ForAccumulation(t: Any) -> Any:
    """`t` in float32 when it is a narrow float (the executor's sums of micro-batches'
    gradients or losses in bfloat16 lose the small terms); anything else as it is."""
    if isinstance(t, tf.Tensor) and IsNarrow(t.dtype):
        return tf.cast(t, tf.float32)
    return t


def Scale(t: Any, factor: tf.Tensor) -> Any:
    """t * factor, computed in float32 when t is narrow (for the executor's final scaling of
    the sums: a float16 product would overflow or underflow), returned in t's dtype."""
    if IsNarrow(t.dtype):
        return tf.cast(tf.cast(t, tf.float32) * tf.cast(factor, tf.float32), t.dtype)
    return t * tf.cast(factor, t.dtype)
