"""Placing a stage on a TPU logical core: annotations where `tf.device` does not reach.

On CPU and GPU a stage's ops run where `tf.device(stage_device)` puts them. Inside a
TPU replica the computation is compiled by XLA, which ignores device scopes; a
replica of K cores places work by annotating tensors with a logical core
(`TPUStrategy.experimental_assign_to_logical_device`). Within

    with placement.LogicalCores(assign, stage_devices):
      ...build or trace the pipeline...

every stage's forward outputs and the gradients its backward returns are annotated
with `assign(tensor, k)`, k being the index of the stage's device in `stage_devices`
(one entry per pipeline device; `sched.DeviceOf(stage)` says which), and XLA places
the ops that produce them on logical core k.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import tensorflow as tf

__all__ = [
    "Annotate",
    "LogicalCores",
    "StageAnnotator",
]

_ACTIVE = threading.local()


@contextlib.contextmanager
def LogicalCores(
    assign: Callable[[tf.Tensor, int], tf.Tensor], stage_devices: Sequence[str]
) -> Iterator[None]:
    """Within, stage k (the one on stage_devices[k]) is annotated for logical core k."""
    previous = getattr(_ACTIVE, "value", None)
    _ACTIVE.value = (assign, list(stage_devices))
    try:
        yield
    finally:
        _ACTIVE.value = previous


def Annotate(device: str, values: Any) -> Any:
    """`values` (a structure) with each tensor annotated for `device`'s logical core, if any."""
    return StageAnnotator(device)(values)


def StageAnnotator(device: str) -> Callable[[Any], Any]:
    """`values -> values annotated for device's logical core` under the active
    LogicalCores, else the identity: a pipeline reads it once, where it starts."""
    active = getattr(_ACTIVE, "value", None)
    if active is None:
        return lambda values: values
    assign, devices = active
    if device not in devices:
        raise ValueError(
            f"placement.Annotate: stage device {device!r} is not one of the logical cores' "
            f"stage devices {devices}"
        )
    core = devices.index(device)
    return lambda values: tf.nest.map_structure(
        lambda t: assign(t, core) if isinstance(t, tf.Tensor) else t, values
    )
