"""Signals while a run runs: SIGTERM and SIGINT stop it cleanly, never half-way.

    with StopSignals() as signals:        # the train loop: stop after the current step
      ... if signals.received: save, raise Stopped(...)
    with StopBeforeSteps():               # from start-up to the loop: stop at once

A second signal raises KeyboardInterrupt (the trainer exits 130). Neither handler
raises where an exception would do harm (`_SentAgainLater`): inside a finalizer
(`__del__`), where Python would print it as 'Exception ignored in ...' and drop it;
inside `threading.Thread.start`, whose bookkeeping an exception breaks; inside abc's
isinstance and issubclass checks, which C code calls back and may not check for an
error (TensorFlow's nest.flatten printed a SystemError, dropped the stop and returned
a short list); and inside what `Uninterruptible` marks (taking and releasing the
logdir's lock). There the signal is sent again shortly, to be handled just after.
"""

from __future__ import annotations

import _thread
import abc
import os
import signal
import threading
import time
from collections.abc import Callable
from types import CodeType
from typing import Any, TypeVar

__all__ = [
    "Ignore",
    "Original",
    "RESEND_AFTER_S",
    "StopBeforeSteps",
    "Stopped",
    "StopSignals",
    "Uninterruptible",
]

_F = TypeVar("_F", bound=Callable)
RESEND_AFTER_S = 0.05  # how soon a signal that came at a bad moment is sent again
# Code a handler must not raise in, besides finalizers: an exception inside
# Thread.start, once the new thread began, breaks threading's records of it
# ('KeyError: <Thread(...)>' from the new thread, or a deadlock on its lock); one
# inside ABCMeta's checks reaches C code that calls them through isinstance, and
# TensorFlow's nest.flatten does not check for it ('SystemError: <built-in function
# __import__> returned a result with an exception set' and a wrong result).
_UNINTERRUPTIBLE: set[CodeType] = {
    threading.Thread.start.__code__,
    abc.ABCMeta.__instancecheck__.__code__,
    abc.ABCMeta.__subclasscheck__.__code__,
}


class Stopped(RuntimeError):
    """Training stopped on SIGTERM or SIGINT after saving a checkpoint (the message says
    which, at what step, and that rerunning the same command resumes)."""


def Original(stop: Stopped) -> Stopped:
    """The Stopped that `stop` wraps, if it wraps one: a signal that lands while a pipeline
    action is built is raised again naming the action (executor), its cause the stop
    itself, whose message is the one the trainer prints."""
    while isinstance(stop.__cause__, Stopped):
        stop = stop.__cause__
    return stop


def Uninterruptible(fn: _F) -> _F:
    """Marks `fn`: a SIGTERM or SIGINT that StopBeforeSteps or StopSignals would raise
    while `fn` (or anything it calls) runs is sent again just after it instead, so
    that `fn` never stops half-way (the logdir lock's Acquire and Release)."""
    _UNINTERRUPTIBLE.add(fn.__code__)
    return fn


def _MustNotRaise(frame) -> bool:
    """Whether `frame` runs inside a `__del__` (TensorFlow deletes its resources there)
    or inside code that must not stop half-way (`_UNINTERRUPTIBLE`)."""
    while frame is not None:
        if frame.f_code.co_name == "__del__" or frame.f_code in _UNINTERRUPTIBLE:
            return True
        frame = frame.f_back
    return False


def _SendLater(signum: int) -> None:
    time.sleep(RESEND_AFTER_S)
    os.kill(os.getpid(), signum)


def _SentAgainLater(signum: int, frame) -> bool:
    """Whether the signal interrupted code a handler must not raise in (`_MustNotRaise`);
    then it is sent again shortly, to be handled outside that code."""
    if not _MustNotRaise(frame):
        return False
    # A bare thread, not threading.Timer: Timer.start takes threading's own lock, which
    # the interrupted Thread.start may hold.
    _thread.start_new_thread(_SendLater, (signum,))
    return True


def Ignore() -> None:
    """From now on SIGTERM and SIGINT do nothing (the run has ended; its status stands).
    Outside the main thread, where Python cannot set handlers, nothing changes."""
    if threading.current_thread() is threading.main_thread():
        for s in _Handlers.SIGNALS:
            signal.signal(s, signal.SIG_IGN)


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
    """While entered (from the trainer's start, TensorFlow's import included, to the
    train loop's StopSignals), SIGTERM and SIGINT end the run at once with Stopped: no
    step has run, so there is nothing to save, and a lock taken is released on the way
    out. Outside the main thread, nothing is caught.

    The handler raises wherever the main thread is (but see _SentAgainLater), so the
    code it hits may re-wrap the Stopped (TensorFlow's tf.Module walk raises
    ValueError('Error processing property ...') from it) or swallow it (a fallback
    that catches everything). The signal is also recorded: an error leaving the block
    after it becomes Stopped, and the train loop's StopSignals, entered inside, starts
    with it (see there).
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
        if _SentAgainLater(signum, frame):
            return  # Recorded when it comes back: the train loop would take it for a second.
        self.received = self.received or signal.Signals(signum).name
        raise self._Stopped()

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
        if self.received is None:
            self.received = signal.Signals(signum).name
        elif not _SentAgainLater(signum, frame):
            raise KeyboardInterrupt
