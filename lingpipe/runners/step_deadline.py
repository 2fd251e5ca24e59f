"""A training step that may not wait for ever: a deadline, and signals heard while waiting.

    value = step_deadline.Call(fn, timeout_s=300, signalled=lambda: signals.received)

runs `fn` in a thread while this (the main) thread waits in short slices, so that
Python's signal handlers run: a step blocked in TensorFlow's runtime on a stage
host that stopped answering (a stopped or hung worker keeps its port open, so
TensorFlow never reports it gone) would otherwise hold the trainer, deaf to SIGTERM
and Ctrl-C, for ever.

- The step does not finish within `timeout_s`: `StepTimeout`.
- A signal was received (the first SIGTERM or SIGINT only asks the loop to stop
  after the step) and the step still runs `grace_s` later: `StoppedWhileWaiting`.
- A second signal raises KeyboardInterrupt in this thread at once (StopSignals).

The blocked thread is left behind (a daemon): nothing can cancel a call into the
runtime; the run ends without saving, its newest checkpoint intact.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = [
    "Call",
    "SIGNAL_GRACE_S",
    "StepTimeout",
    "StoppedWhileWaiting",
]

_T = TypeVar("_T")
SIGNAL_GRACE_S = 5.0
_SLICE_S = 0.1


class StepTimeout(RuntimeError):
    """The step did not finish within its deadline (`timeout_s` seconds)."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"the step did not finish within {timeout_s:g} s")
        self.timeout_s = timeout_s


class StoppedWhileWaiting(RuntimeError):
    """A signal (its name: `signal_name`) came while the step could not finish."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(f"{signal_name} while the step waited")
        self.signal_name = signal_name


def Call(
    fn: Callable[[], _T],
    timeout_s: float,
    signalled: Callable[[], str | None],
    grace_s: float = SIGNAL_GRACE_S,
    name: str = "step",
) -> _T:
    """fn() with a deadline (see the module docstring); its value, or its exception."""
    box: dict = {}

    def Run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = e

    thread = threading.Thread(target=Run, daemon=True, name=name)
    thread.start()
    deadline = time.monotonic() + timeout_s
    heard: float | None = None
    while True:
        thread.join(_SLICE_S)
        if not thread.is_alive():
            break
        now = time.monotonic()
        name_of_signal = signalled()
        if name_of_signal and heard is None:
            heard = now
        if heard is not None and now - heard > grace_s:
            raise StoppedWhileWaiting(name_of_signal)
        if now > deadline:
            raise StepTimeout(timeout_s)
    if "error" in box:
        raise box["error"]
    return box["value"]
