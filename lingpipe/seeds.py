"""Stateless random seeds for layers: the same step, layer and stream give the same numbers.

Randomness in lingpipe layers (dropout) uses `tf.random.stateless_*` ops only:
stateful random ops are chained in program order by `tf.function` and would
serialize a pipeline, and recomputation in backward must reproduce the forward's
masks exactly. A seed is the layer's own base seed (from its path and
`random_seed`) folded with the values of the enclosing `StepSeedScope`s: the
training step, then, inside a pipeline, the micro-batch index.

    with seeds.StepSeedScope(global_step):          # set by the train loop
      with seeds.StepSeedScope(micro_batch_index):  # set by the pipeline
        y = dropout(x)
"""

from __future__ import annotations

import contextlib
import threading
import zlib
from collections.abc import Iterator

import tensorflow as tf

__all__ = [
    "BaseSeed",
    "CurrentScopeValues",
    "RestoreScopeValues",
    "StatelessSeed",
    "StepSeedScope",
]

_state = threading.local()


def _Stack() -> list:
    if not hasattr(_state, "stack"):
        _state.stack = []
    return _state.stack


@contextlib.contextmanager
def StepSeedScope(*values: int | tf.Tensor) -> Iterator[None]:
    """Folds `values` (ints or int scalar tensors) into every seed made inside."""
    depth = len(_Stack())
    _Stack().extend(values)
    try:
        yield
    finally:
        # The current stack (RestoreScopeValues may have swapped the list), back to its
        # depth: stack[-len(values):] would be all of it for a scope of no values.
        del _Stack()[depth:]


def CurrentScopeValues() -> tuple:
    """The values of the enclosing StepSeedScopes, outermost first."""
    return tuple(_Stack())


@contextlib.contextmanager
def RestoreScopeValues(values: tuple) -> Iterator[None]:
    """Runs the body with exactly `values` as the scope (used to replay a forward in backward)."""
    saved = list(_Stack())
    _state.stack = list(values)
    try:
        yield
    finally:
        _state.stack = saved


def BaseSeed(path: str, random_seed: int | None) -> tuple[int, int]:
    """A layer's fixed seed pair: its `random_seed` (0 if None) and a hash of its path."""
    return (int(random_seed or 0) & 0x7FFFFFFF, zlib.crc32(path.encode("utf-8")) & 0x7FFFFFFF)


def StatelessSeed(path: str, random_seed: int | None) -> tf.Tensor:
    """An int32 seed of shape [2] for tf.random.stateless_* ops, folded with the scopes."""
    seed = tf.constant(BaseSeed(path, random_seed), dtype=tf.int32)
    for value in _Stack():
        seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(value, tf.int32))
    return seed
