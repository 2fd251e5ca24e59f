"""Position signals for sequence models."""

from __future__ import annotations

import math

import tensorflow as tf

__all__ = [
    "Sinusoidal",
]


def Sinusoidal(length: int, dims: int, dtype: tf.DType = tf.float32) -> tf.Tensor:
    """[length, dims]: sin(pos * inv_timescale_i) for dims // 2 timescales from 1 to 1e4,
    then the cosines (a zero column last when dims is odd)."""
    num_timescales = dims // 2
    increment = math.log(1.0e4) / max(num_timescales - 1, 1)
    inv_timescales = tf.exp(tf.range(num_timescales, dtype=tf.float32) * -increment)
    scaled = tf.range(length, dtype=tf.float32)[:, tf.newaxis] * inv_timescales[tf.newaxis, :]
    signal = tf.concat([tf.sin(scaled), tf.cos(scaled)], axis=1)
    if dims % 2:
        signal = tf.pad(signal, [[0, 0], [0, 1]])
    return tf.cast(signal, dtype)
