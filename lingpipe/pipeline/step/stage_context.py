"""StageContext: what one action of a stage needs, built per action and passed to it."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

from lingpipe import base_layer, seeds

__all__ = [
    "Entered",
    "StageContext",
]


@dataclasses.dataclass(frozen=True)
class StageContext:
    """What the work of a stage on a micro-batch (forward, recomputation or backward) needs.

    Attributes:
      device: where its ops run.
      seed_scope: the values of seeds.StepSeedScope for this micro-batch (the
        step's, then the micro-batch index), so a replayed forward draws the same
        dropout masks.
      recompute: whether this replays a forward that already ran (batch norm then
        records nothing).
      annotate: maps a structure of tensors to the same, annotated for the stage's
        TPU logical core (identity elsewhere).
    """

    device: str
    seed_scope: tuple = ()
    recompute: bool = False
    annotate: Callable[[Any], Any] = lambda values: values

    def Replay(self) -> StageContext:
        """The same work, as a recomputation."""
        return dataclasses.replace(self, recompute=True)


@contextlib.contextmanager
def Entered(ctx: StageContext) -> Iterator[None]:
    """The device, seed scope and recomputation flag of `ctx`."""
    with (
        tf.device(ctx.device),
        seeds.RestoreScopeValues(ctx.seed_scope),
        base_layer.Recomputation(ctx.recompute),
    ):
        yield
