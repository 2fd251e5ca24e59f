"""StageContext: what one piece of a stage's work needs, passed to it as one value.

A stage's forward, its recomputation and its backward run on the stage's device,
inside the seed scope of their micro-batch (so dropout draws the same masks when
a forward is replayed), flagged as a recomputation when they replay a forward
(batch norm then records nothing), and, on TPU, with their tensors annotated for
the stage's logical core. The pipeline builds one StageContext per action and
hands it to the code that runs the action; `Entered(ctx)` enters all of it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

from lingpipe import base_layer, seeds


@dataclasses.dataclass(frozen=True)
class StageContext:
    """What the work of `stage` on `micro_batch` needs.

    Attributes:
      stage: the stage's index (a virtual stage when interleaved).
      device: where its ops run.
      micro_batch: which micro-batch.
      seed_scope: the values of seeds.StepSeedScope for this micro-batch (the
        step's, then the micro-batch index).
      recompute: whether this replays a forward that already ran.
      annotate: maps a structure of tensors to the same, annotated for the stage's
        TPU logical core (identity elsewhere).
    """

    stage: int
    device: str
    micro_batch: int
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
