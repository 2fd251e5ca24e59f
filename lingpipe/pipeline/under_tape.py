"""A pipeline's forwards under a caller's tape: one custom gradient around the executor.

    outputs = under_tape.Differentiable(tensors, forward, backward, device)

`forward` runs executor.Forward and the gradient `backward` the executor's
backwards (executor.Backward), each action on its stage's device, so
`tf.GradientTape` and `tf.gradients`, eagerly or in `tf.function`, train a
pipeline through the same engine as a schedule's ForwardBackward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf


def ReadWhereItLives(x: Any) -> Any:
    """A variable's value, read on its device (a tensor as it is)."""
    if not isinstance(x, tf.Variable):
        return x
    with tf.device(x.device):
        return tf.convert_to_tensor(x)


def Differentiable(
    tensors: Sequence[Any],
    forward: Callable[[list], tuple[Any, Any]],
    backward: Callable[[Any, Any], tuple[list, dict]],
    device: str,
) -> Any:
    """forward's outputs, differentiable with respect to `tensors`.

    Args:
      tensors: the tensors and variables to differentiate (weights, inputs); a
        variable is read on its own device.
      forward: (the tensors' values) -> (outputs, a structure of tensors; state for
        backward, the executor's step).
      backward: (state, output gradients like outputs) -> (a gradient per tensor,
        None where none; {variable.ref(): gradient} of variables forward read
        besides `tensors`).
      device: where the custom gradient's own identity ops go (the last stage's).
    """
    structure = []

    @tf.custom_gradient
    def Pipelined(*values):
        outputs, state = forward(list(values))
        structure[:] = [outputs]

        def Grad(*dys, variables=None):
            # tf.gradients colocates a gradient with its op: undo it, each action of the
            # executor enters its own stage's device.
            with tf.compat.v1.get_default_graph().colocate_with(None, ignore_existing=True):
                grads, extra = backward(state, tf.nest.pack_sequence_as(outputs, list(dys)))
            grads = [
                None if g is None or not v.dtype.is_floating else tf.cast(g, v.dtype)
                for v, g in zip(values, grads)
            ]
            return grads, [extra.get(v.ref()) for v in variables or []]

        return tf.nest.flatten(outputs), Grad

    read = [ReadWhereItLives(x) for x in tensors]
    with tf.device(device):
        flat = Pipelined(*read)
    return tf.nest.pack_sequence_as(structure[0], flat)
