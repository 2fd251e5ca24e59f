"""Helpers that many tests need: seeds, tolerances, eager-vs-tf.function checks."""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import tensorflow as tf

__all__ = [
    "ATOL",
    "AssertAllClose",
    "AssertAllCloseToScale",
    "AssertEagerEqualsFunction",
    "AssertGradientsExist",
    "CheckpointRoundTrip",
    "CountVariables",
    "DeviceOrder",
    "GradientsOf",
    "RTOL",
    "RunEagerAndFunction",
    "SeedFor",
    "SetSeeds",
]

# "The same" means equal to float32 rounding: relative 1e-5, absolute 1e-6 near zero.
RTOL = 1e-5
ATOL = 1e-6


def SeedFor(test_name: str) -> int:
    """A stable seed derived from a test's name, so each test has its own numbers."""
    return zlib.crc32(test_name.encode("utf-8")) & 0x7FFFFFFF


def SetSeeds(seed: int) -> None:
    """Seeds Python, NumPy and TensorFlow's global generators."""
    random.seed(seed)
    np.random.seed(seed)
    tf.random.set_seed(seed)


def AssertAllClose(actual: Any, expected: Any, rtol: float = RTOL, atol: float = ATOL) -> None:
    """Structure-aware allclose over tensors, arrays and nested structures of them."""
    tf.nest.assert_same_structure(actual, expected)
    for i, (a, e) in enumerate(zip(tf.nest.flatten(actual), tf.nest.flatten(expected))):
        np.testing.assert_allclose(
            np.asarray(a), np.asarray(e), rtol=rtol, atol=atol, err_msg=f"leaf {i}"
        )


def AssertAllCloseToScale(actual: Any, expected: Any, rtol: float = RTOL) -> None:
    """Each leaf within rtol of its own scale: |a - e| <= rtol * (|e| + max|e|).

    For sums in another order (gradients accumulated over micro-batches), an
    element that nearly cancels to 0 has no meaningful relative error of its own;
    float32 rounding is relative to the magnitudes that were summed.
    """
    tf.nest.assert_same_structure(actual, expected)
    for i, (a, e) in enumerate(zip(tf.nest.flatten(actual), tf.nest.flatten(expected))):
        a, e = np.asarray(a), np.asarray(e)
        scale = float(np.max(np.abs(e))) if e.size else 0.0
        np.testing.assert_allclose(a, e, rtol=rtol, atol=rtol * scale, err_msg=f"leaf {i}")


def RunEagerAndFunction(fn: Callable[..., Any], *args: Any) -> tuple[Any, Any]:
    """Runs fn(*args) eagerly and inside tf.function; returns both results as numpy."""
    eager = fn(*args)
    traced = tf.function(fn)(*args)
    as_np = lambda s: tf.nest.map_structure(lambda t: np.asarray(t), s)  # noqa: E731
    return as_np(eager), as_np(traced)


def AssertEagerEqualsFunction(
    fn: Callable[..., Any], *args: Any, rtol: float = RTOL, atol: float = ATOL
) -> Any:
    """Checks that fn gives the same result eagerly and in tf.function; returns it."""
    eager, traced = RunEagerAndFunction(fn, *args)
    AssertAllClose(traced, eager, rtol=rtol, atol=atol)
    return eager


def GradientsOf(layer: tf.Module, loss_fn: Callable[[], tf.Tensor]) -> dict[str, tf.Tensor | None]:
    """Gradients of loss_fn() with respect to each trainable variable, keyed by name."""
    variables = layer.trainable_variables
    with tf.GradientTape() as tape:
        loss = loss_fn()
    grads = tape.gradient(loss, variables)
    return {v.name: g for v, g in zip(variables, grads)}


def AssertGradientsExist(layer: tf.Module, loss_fn: Callable[[], tf.Tensor]) -> None:
    """Every trainable variable of `layer` gets a gradient (not None) from loss_fn."""
    grads = GradientsOf(layer, loss_fn)
    if not grads:
        raise AssertionError(f"{layer.name} has no trainable variables")
    missing = [name for name, g in grads.items() if g is None]
    if missing:
        raise AssertionError(f"no gradient for {missing}")


class CountVariables:
    """Context manager that counts tf.Variables created inside it.

    with test_utils.CountVariables() as counter:
      meta = Layer.FPropMeta(p, [2, 3])
    assert counter.count == 0
    """

    def __init__(self) -> None:
        self.count = 0
        self._scope = None

    def _Creator(self, next_creator, **kwargs):
        self.count += 1
        return next_creator(**kwargs)

    def __enter__(self) -> CountVariables:
        self._scope = tf.variable_creator_scope(self._Creator)
        self._scope.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._scope.__exit__(*exc)


def CheckpointRoundTrip(build_layer: Callable[[], tf.Module], inputs: Any, directory: str) -> None:
    """Saves a built layer, restores into a fresh one, and checks identical outputs.

    `build_layer` must give a layer whose initial weights differ between calls
    only through the restore (use different random_seed in the callable if needed).
    """
    first = build_layer()
    expected = first(inputs)
    path = tf.train.Checkpoint(model=first).write(f"{directory}/ckpt")
    second = build_layer()
    status = tf.train.Checkpoint(model=second).read(path)
    status.assert_existing_objects_matched().assert_consumed()
    AssertAllClose(second(inputs), expected, rtol=0, atol=0)


def DeviceOrder(spans: Iterable[Any], step: int, device: int) -> list[Any]:
    """The actions of `device` in `step` of measured spans (timeline.Span), in the order
    they started."""
    mine = [s for s in spans if s.step == step and s.device == device]
    return [s.action for s in sorted(mine, key=lambda s: s.start_us)]
