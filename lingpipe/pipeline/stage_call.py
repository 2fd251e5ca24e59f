"""StageCall: one differentiable unit of pipeline work pinned to one device.

Inside `tf.function`, `tf.GradientTape` leaves gradient ops unplaced (they run on
CPU:0), and so does the backward of `tf.recompute_grad`. A StageCall is a
`tf.custom_gradient` whose forward, recomputation and backward all enter the
stage's `tf.device`, so every op of a stage stays on its device whether the
caller takes gradients with a tape or with `tf.gradients`, eagerly or traced.

With `recompute=True` the forward keeps nothing but its inputs, and the backward
replays it (in its StageContext as a recomputation: same stateless seed scope,
batch-norm statistics not counted twice) under a tape before taking gradients:
this is `tf.recompute_grad`'s mechanism with the device, seeds and statistics
handled.

StageCall serves `PipeliningLayer.FProp`, whose backward is whatever the
caller's tape builds; `PipeliningLayer.ForwardBackward` runs a schedule with
the executor (lingpipe.pipeline.executor) instead.
With `recompute=False` the forward runs under a tape that keeps its activations
and the backward only differentiates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from lingpipe.pipeline.stage_context import Entered, StageContext


def _IsFloat(t: Any) -> bool:
    return isinstance(t, (tf.Tensor, tf.Variable)) and t.dtype.is_floating


def _IsTensor(x: Any) -> bool:
    return isinstance(x, (tf.Tensor, tf.Variable))


def _Differentiate(tape: tf.GradientTape, outputs: list, dys: Sequence[Any], sources: list) -> list:
    pairs = [(o, dy) for o, dy in zip(outputs, dys) if dy is not None and _IsFloat(o)]
    if not pairs:
        return [None] * len(sources)
    return tape.gradient(
        [o for o, _ in pairs],
        sources,
        output_gradients=[dy for _, dy in pairs],
        unconnected_gradients=tf.UnconnectedGradients.NONE,
    )


class GradientAccumulator:
    """Sums the gradient of weights shared by `num_calls` StageCalls of one stage.

    Backward i waits for backward i-1 (in the order the tape builds them), adds
    its weights' gradient to the running sum on the stage's device and returns
    None for them; the last returns the total. So the stage differentiates one
    micro-batch at a time, holds one running sum instead of M gradients, and the
    tape never aggregates the weights' gradient itself (off the stage's device).
    """

    def __init__(self, num_calls: int) -> None:
        self.num_calls = num_calls
        self._Reset()

    def _Reset(self) -> None:
        self._sum: list | None = None
        self._count = 0
        self._done: list = []

    def Wait(self) -> list:
        """What the next backward must run after."""
        return [] if tf.executing_eagerly() else list(self._done)

    def Add(self, shared_grads: list) -> list:
        """Adds one call's gradients; returns what that call should hand the tape."""
        # A lookup's gradient is IndexedSlices; the running sum is dense (one table's
        # worth, where concatenated slices would grow with every micro-batch).
        shared_grads = [
            tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in shared_grads
        ]
        if self._sum is None:
            self._sum = list(shared_grads)
        else:
            self._sum = [
                b if a is None else a if b is None else a + b
                for a, b in zip(self._sum, shared_grads)
            ]
        self._count += 1
        if not tf.executing_eagerly():
            # The sums are made on this device after this backward's weight gradients:
            # waiting for them orders the stage's backwards without a new op.
            self._done = [g for g in self._sum if g is not None] or self._done
        if self._count < self.num_calls:
            return [None] * len(shared_grads)
        total = self._sum
        self._Reset()  # ready for the next gradient computation
        return total


def StageCall(
    fn: Callable[..., Any],
    inputs: tuple,
    ctx: StageContext,
    recompute: bool,
    after: Sequence[Any] = (),
    name: str = "stage_call",
    accumulator: GradientAccumulator | None = None,
) -> Any:
    """Runs `fn(*inputs)` on `ctx.device` as one unit whose backward runs there too.

    Args:
      fn: a function of the structures in `inputs`, returning a structure of tensors.
      inputs: a tuple of structures (tensors, NestedMaps, tuples; non-tensor leaves
        are passed through as constants). Every floating tensor is differentiable.
      ctx: the stage's context: device (where the forward, recomputation and
        gradients run), seed scope and TPU annotation.
      recompute: drop the forward's activations and replay it in backward.
      after: tensors whose producers must run before this forward (the schedule's
        ordering); ignored eagerly.
      name: name scope of the forward ops; the backward's is `<name>_grad`.
      accumulator: shared by the calls of one stage whose `inputs[0]` are the same
        weights: their backwards run one after another and the weights' gradient
        is summed across them (see GradientAccumulator).

    Returns:
      fn's outputs, same structure.
    """
    flat = tf.nest.flatten(inputs)
    tensor_pos = [i for i, x in enumerate(flat) if _IsTensor(x)]
    num_shared = sum(1 for x in tf.nest.flatten(inputs[0]) if _IsTensor(x)) if inputs else 0
    if not tensor_pos:  # nothing to differentiate (a stage without weights, say)
        return PlainCall(fn, inputs, ctx, after, name)
    device = ctx.device
    out_structure = []

    def Run(tensors: Sequence[tf.Tensor]) -> list:
        leaves = list(flat)
        for i, t in zip(tensor_pos, tensors):
            leaves[i] = t
        outputs = fn(*tf.nest.pack_sequence_as(inputs, leaves))
        out_structure[:] = [outputs]
        # Inside the tape: a TPU's logical-core annotation is part of what is differentiated.
        return ctx.annotate(tf.nest.flatten(outputs))

    @tf.custom_gradient
    def Call(*tensors):
        with Entered(ctx), tf.name_scope(name), tf.control_dependencies(list(after)):
            if recompute:
                tape = None
                outputs = Run(tensors)
            else:
                with tf.GradientTape(watch_accessed_variables=True) as tape:
                    tape.watch([t for t in tensors if _IsFloat(t)])
                    outputs = Run(tensors)

        def Grad(*dys, variables=None):
            variables = list(variables or [])
            wait = accumulator.Wait() if accumulator is not None else []
            with (
                tf.device(device),
                tf.name_scope(f"{name}_grad"),
                tf.control_dependencies(wait),
            ):
                if recompute:
                    with tf.GradientTape() as replay, Entered(ctx.Replay()):
                        replay.watch([t for t in tensors if _IsFloat(t)])
                        again = Run(tensors)
                    grads = _Differentiate(replay, again, dys, list(tensors) + variables)
                else:
                    grads = _Differentiate(tape, outputs, dys, list(tensors) + variables)
                if accumulator is not None:
                    grads[:num_shared] = accumulator.Add(grads[:num_shared])
                grads = ctx.annotate(grads)
            input_grads = [g if _IsFloat(t) else None for t, g in zip(tensors, grads)]
            return input_grads, grads[len(tensors) :]

        return outputs, Grad

    tensors = [flat[i] for i in tensor_pos]
    # custom_gradient wraps inputs and outputs in Identity/IdentityN ops of its own,
    # made outside Call's body: place them too, or every stage boundary would
    # bounce through the default device.
    with tf.device(device), tf.name_scope(f"{name}_io"):
        outputs = Call(*tensors)
    return tf.nest.pack_sequence_as(out_structure[0], tf.nest.flatten(outputs))


def PlainCall(
    fn: Callable[..., Any],
    inputs: tuple,
    ctx: StageContext,
    after: Sequence[Any] = (),
    name: str = "stage_call",
) -> Any:
    """StageCall without a custom gradient: for eval and inference, where nothing is kept."""
    with Entered(ctx), tf.name_scope(name), tf.control_dependencies(list(after)):
        return ctx.annotate(fn(*inputs))
