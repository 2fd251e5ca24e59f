"""Driver: what a pipelined layer does around the executor, once for every layer.

    drive = driver.Driver(devices, sched.stage_devices, remat="always", batch_dim=0)
    y = drive.Differentiable(weights, args, sizes, make_stages, weight_grads)  # any tape
    y, step = drive.Forward(stages, args, sizes)                             # evaluation
    result = drive.Run(sched, stages, args, sizes, loss_fn, loss_inputs)     # a schedule

The driver splits the inputs on the first device (`split`) and the loss inputs
on the last stage's (`split_loss`), merges the outputs there (`merge`) and gives
each action its StageContext.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from lingpipe import seeds
from lingpipe.pipeline.schedules import generators, schedule
from lingpipe.pipeline.step import executor, micro_batch, placement, remat
from lingpipe.pipeline.step.stage_context import StageContext

__all__ = [
    "Driver",
]


def _ReadWhereItLives(x: Any) -> Any:
    """A variable's value, read on its device (a tensor as it is)."""
    if not isinstance(x, tf.Variable):
        return x
    with tf.device(x.device):
        return tf.convert_to_tensor(x)


@dataclasses.dataclass(frozen=True)
class Driver:
    """Runs stages on `devices`, stage s on devices[stage_devices[s]] (the schedule's
    placement), splitting along `batch_dim`, keeping activations under `remat` (one
    policy, or one per stage: remat.Kept). `merge_one`: one micro-batch's outputs are
    merged too (an unbatched leaf then gets a leading dimension of 1, as it gets M for M
    micro-batches). `sparse_grads`: Run keeps embeddings' gradients as tf.IndexedSlices
    (executor.Run)."""

    devices: Sequence[str]
    stage_devices: tuple[int, ...]
    remat: remat.Remat
    batch_dim: int = 0
    merge_one: bool = False
    sparse_grads: bool = False

    @property
    def last_device(self) -> str:
        return self.devices[self.stage_devices[-1]]

    def _Contexts(self) -> Callable[[int, int], StageContext]:
        """context(s, m) -> StageContext: device, seed scope and TPU annotation, read
        once here (the step's seed scope, the active logical cores) and passed down."""
        scope = seeds.CurrentScopeValues()
        annotators = [placement.StageAnnotator(d) for d in self.devices]

        def Context(s: int, m: int) -> StageContext:
            d = self.stage_devices[s]
            return StageContext(self.devices[d], scope + (m,), False, annotators[d])

        return Context

    def _Split(self, args: Any, sizes: list, device: str, name: str) -> list:
        with tf.device(device), tf.name_scope(name):
            return micro_batch.Split(args, sizes, self.batch_dim)

    def Forward(self, stages: list, args: Any, sizes: list, backward: bool = False) -> tuple:
        """The fill-drain forwards over the placement ('gpipe', or without `backward`
        'forward_only') -> (the last stage's outputs merged, the executor's step)."""
        name = "gpipe" if backward else "forward_only"
        sched = generators.BreadthFirst(
            name, len(self.devices), len(sizes), placement=self.stage_devices
        )
        micro_args = self._Split(args, sizes, self.devices[0], "split")
        keep = remat.Kept(sched, self.remat)
        step = executor.Forward(sched, stages, micro_args, keep, self._Contexts())
        if len(sizes) == 1 and not self.merge_one:
            return step.Outputs()[0], step
        with tf.device(self.last_device), tf.name_scope("merge"):
            return micro_batch.Merge(step.Outputs(), sizes, self.batch_dim), step

    def Differentiable(
        self,
        weights: Any,
        args: Any,
        sizes: list,
        make_stages: Callable[[Any], list[executor.Stage]],
        weight_grads: Callable[[Any, executor.Result], Any],
    ) -> Any:
        """Forward(backward=True)'s outputs, differentiable with respect to the tensors
        and variables in `weights` and `args` (a variable is read on its own device):
        one custom gradient whose gradient splits the outputs' gradient on the last
        stage's device (`split_dy`), runs the executor's backwards and merges the
        inputs' gradient on the first device (`merge_dx`), so `tf.GradientTape` and
        `tf.gradients`, eagerly or in `tf.function`, train the pipeline.

        make_stages: the weights' values (like `weights`) -> the stages.
        weight_grads: (the weights' values, the executor's Result) -> gradients like them.
        """
        flat, dim = tf.nest.flatten((weights, args)), self.batch_dim
        pos = [i for i, x in enumerate(flat) if isinstance(x, (tf.Tensor, tf.Variable))]
        structure = []

        @tf.custom_gradient
        def Pipelined(*values):
            leaves = list(flat)
            for i, t in zip(pos, values):
                leaves[i] = t
            w, a = tf.nest.pack_sequence_as((weights, args), leaves)
            outputs, step = self.Forward(make_stages(w), a, sizes, backward=True)
            structure[:] = [outputs]

            def Grad(*dys, variables=None):
                # tf.gradients colocates a gradient with its op: undo it, each action of the
                # executor enters its own stage's device.
                with tf.compat.v1.get_default_graph().colocate_with(None, ignore_existing=True):
                    dys = tf.nest.pack_sequence_as(outputs, list(dys))
                    with tf.device(self.last_device), tf.name_scope("split_dy"):
                        micro_dys = micro_batch.SplitLike(dys, step.Outputs(), sizes, dim)
                    result = executor.Backward(step, micro_dys)
                    with tf.device(self.devices[0]), tf.name_scope("merge_dx"):
                        dx = micro_batch.MergeGradients(result.input_grads, a, sizes, dim)
                    grads = tf.nest.flatten((weight_grads(w, result), dx))
                grads = [
                    None if g is None or not v.dtype.is_floating else tf.cast(g, v.dtype)
                    for v, g in zip(values, [grads[i] for i in pos])
                ]
                return grads, [result.extra_grads.get(v.ref()) for v in variables or []]

            return tf.nest.flatten(outputs), Grad

        read = [_ReadWhereItLives(flat[i]) for i in pos]
        with tf.device(self.last_device):
            outputs = Pipelined(*read)
        return tf.nest.pack_sequence_as(structure[0], outputs)

    def Run(
        self,
        sched: schedule.Schedule,
        stages: list[executor.Stage],
        args: Any,
        sizes: list,
        loss_fn: Callable[[Any, Any], Any],
        loss_inputs: Any = None,
        loss_scale: tf.Tensor | None = None,
    ) -> executor.Result:
        """executor.Run of `sched` on the micro-batches of `args` and of `loss_inputs`
        (None: loss_fn gets None)."""
        micro_args = self._Split(args, sizes, self.devices[0], "split")
        micro_loss = [None] * len(sizes)
        if loss_inputs is not None:
            micro_loss = self._Split(loss_inputs, sizes, self.last_device, "split_loss")
        keep, context = remat.Kept(sched, self.remat), self._Contexts()
        return executor.Run(
            sched,
            stages,
            micro_args,
            loss_fn,
            micro_loss,
            keep,
            context,
            loss_scale,
            self.sparse_grads,
        )
