"""Signals while a run runs: SIGTERM and SIGINT stop it cleanly, never half-way.

    with StopSignals() as signals:        # the train loop: stop after the current step
      ... if signals.received: save, raise Stopped(...)
    with StopBeforeSteps():               # from the lock to the loop: stop at once

A second signal raises KeyboardInterrupt (the trainer exits 130), except inside a
finalizer (`__del__`), where Python would print it as 'Exception ignored in ...' and
drop it: there the signal is sent again just after (`_Raise`).
"""

from __future__ import annotations

import abc
import os
import signal
import threading
from typing import Any


class Stopped(RuntimeError):
    """Training stopped on SIGTERM or SIGINT after saving a checkpoint (the message says
    which, at what step, and that rerunning the same command resumes)."""


def _InFinalizer(frame) -> bool:
    """Whether `frame` runs inside a `__del__` (TensorFlow deletes its resources there)."""
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _Raise(error: BaseException, signum: int, frame) -> None:
    """Raises `error` from a signal handler, unless the signal interrupted a `__del__`:
    Python would print the error there as 'Exception ignored in ...' and drop it. Then
    the signal is sent again shortly, to be handled outside the finalizer."""
    if _InFinalizer(frame):
        threading.Timer(0.05, os.kill, (os.getpid(), signum)).start()
        return
    raise error


class _Handlers(abc.ABC):
    """Installs `_Handle` for SIGTERM and SIGINT while entered, restoring the previous
    handlers on exit. Outside the main thread, where Python cannot set handlers,
    nothing is caught."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}

    @abc.abstractmethod
    def _Handle(self, signum: int, frame) -> None:
        """What a signal does (a signal handler: it runs between two bytecodes)."""

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._previous[s] = signal.signal(s, self._Handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()


class StopBeforeSteps(_Handlers):
    """While entered (from taking the logdir's lock to the train loop's StopSignals),
    SIGTERM and SIGINT end the run at once with Stopped: no step has run, so there is
    nothing to save, and the lock is released on the way out. Outside the main thread,
    nothing is caught.

    The handler raises wherever the main thread is, so the code it hits may re-wrap
    the Stopped (TensorFlow's tf.Module walk raises ValueError('Error processing
    property ...') from it) or swallow it (a fallback that catches everything). The
    signal is also recorded: an error leaving the block after it becomes Stopped, and
    the train loop's StopSignals, entered inside, starts with it (see there).
    """

    def __init__(self) -> None:
        super().__init__()
        self.received: str | None = None  # the name of the first signal

    def _Stopped(self) -> Stopped:
        return Stopped(
            f"Stopped by {self.received} before any step ran; the checkpoints are as they "
            "were; rerun the same command to resume"
        )

    def _Handle(self, signum: int, frame) -> None:
        self.received = self.received or signal.Signals(signum).name
        _Raise(self._Stopped(), signum, frame)

    def __exit__(self, exc_type, exc, tb) -> None:
        super().__exit__()
        if self.received and exc is not None and not isinstance(exc, (Stopped, KeyboardInterrupt)):
            raise self._Stopped() from exc


class StopSignals(_Handlers):
    """While entered, SIGTERM and SIGINT ask the loop to stop after the current step.

    A second signal of either kind gives up at once (KeyboardInterrupt). Outside the
    main thread, where Python cannot set handlers, nothing is caught.
    """

    def __init__(self) -> None:
        super().__init__()
        self.received: str | None = None  # the name of the first signal

    def __enter__(self):
        super().__enter__()
        # A signal that StopBeforeSteps heard but the code it hit swallowed: stop after
        # the first step, as if it had come during it.
        for handler in self._previous.values():
            if isinstance(getattr(handler, "__self__", None), StopBeforeSteps):
                self.received = self.received or handler.__self__.received
        return self

    def _Handle(self, signum: int, frame) -> None:
        # Only a flag: logging here could deadlock on a lock the interrupted code holds.
        if self.received is not None:
            _Raise(KeyboardInterrupt(), signum, frame)
        self.received = signal.Signals(signum).name
