"""XLA per stage: each stage's work compiled for its own device.

`jit_compile=True` over a whole pipelined step fails: the step reads variables
on several devices ("access resource ... CPU:1 from device CPU:0"). A stage's
work reads only its own device's weights and activations, so it compiles:

    run = xla.Compiled(stage_fn)     # same signature as stage_fn
    outputs = run(weights, inputs)   # under tf.device(stage device)

Each call traces a new `tf.function(jit_compile=True)` of `stage_fn` (its
closure, e.g. the micro-batch's seed scope and whether it is a recomputation,
is read at trace time and differs between calls); the call op gets the caller's
device. Under a tape TensorFlow builds its gradient as a second function with the
same `_XlaMustCompile` attribute, on the same device, so a stage's forward,
recomputation and backward are each one compiled kernel cluster. Variables are
read before the call: the compiled function takes only tensors, and the read,
recorded by the caller's tape, carries the gradient to the variable.

Dropout under XLA draws other masks than uncompiled: `tf.random.stateless_*`
gives other bits in XLA than in TensorFlow's kernels (for the same seed and
algorithm). The masks are still a function of the step and micro-batch, and a
replayed forward, compiled too, draws the same ones as its first run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

__all__ = [
    "Compiled",
]


def _Read(x: Any) -> Any:
    return tf.convert_to_tensor(x) if isinstance(x, tf.Variable) else x


def Compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, compiled with XLA at each call for the device the call is made on."""

    def Run(*args: Any) -> Any:
        compiled = tf.function(fn, jit_compile=True, autograph=False)
        return compiled(*tf.nest.map_structure(_Read, args))

    return Run
