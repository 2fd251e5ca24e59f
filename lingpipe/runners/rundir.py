"""The run directory (logdir) while a run runs: its lock, its recorded state, safe writes.

    with LogdirLock(logdir):                  # LogdirLockedError if another run holds it
      state = ReadRunState(logdir)            # None for a new logdir
      ...
      WriteRunState(logdir, RunState('trained', step=400, max_steps=400))

Every path goes through `tf.io.gfile`, so a logdir may be local, `gs://...` or
TensorFlow's in-memory `ram://...`; a write that fails (full disk, no permission)
raises `LogdirWriteError` naming the path and the reason.

The lock is the file `lingpipe.lock` in the logdir, holding the holder's host, pid,
start time and the time it last confirmed it still runs (every `heartbeat_s`). A
lock is stale, and is taken over with a warning, when its holder is gone: on this
host, when its pid no longer runs; from another host (a shared or cloud logdir,
where a pid cannot be checked), when it has not been confirmed for `stale_after_s`.
`tf.io.gfile` has no exclusive create: on the local file system the lock is created
with a hard link, which fails if it exists, and the whole of taking it (reading a
stale holder, removing it, creating the new lock) runs under an advisory `flock` of
the logdir itself, so two runs started at once, even on a dead run's lock, never
both take it; elsewhere it is renamed into place and read back, which narrows but
does not close that window.

Taking and releasing the lock are never stopped half-way by the trainer's SIGTERM and
SIGINT handlers (`stop_signals.Uninterruptible`: the signal is handled just after),
and Release works at any instant of Acquire otherwise (a KeyboardInterrupt): the
holder is known before its file can exist, and the heartbeat thread is never waited
for, only a write it has begun.

The run state (`run_state.json`) says how the run last ended, so that a rerun of
the same command completes what is missing (the final evaluation) and otherwise
says there is nothing to do:

    {"status": "trained", "step": 400, "max_steps": 400, "evaluated_step": 400, ...}
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import json
import os
import socket
import threading
import time

import tensorflow as tf
from absl import logging

from lingpipe.runners import stop_signals

__all__ = [
    "LOCK_FILE",
    "LogdirLock",
    "LogdirLockedError",
    "LogdirWriteError",
    "ReadRunState",
    "Reason",
    "RUN_STATE_FILE",
    "RunState",
    "STATUSES",
    "WriteRunState",
    "WriteText",
]

LOCK_FILE = "lingpipe.lock"
RUN_STATE_FILE = "run_state.json"
# status of RunState: how the run last ended (or that it is running).
STATUSES = ("running", "stopped", "failed", "trained")


class LogdirLockedError(RuntimeError):
    """Another run holds the logdir's lock (the message names it)."""


class LogdirWriteError(RuntimeError):
    """A file of the run could not be written (the message names it and why)."""


def Reason(e: BaseException) -> str:
    """The first line of an OS or TensorFlow error, without the exception's repr."""
    text = getattr(e, "message", None) or getattr(e, "strerror", None) or str(e)
    return (text.splitlines() or [type(e).__name__])[0]


def _TempName(path: str) -> str:
    """A temporary name beside `path`, of which `path` is not a prefix (TensorFlow's
    ram:// file system says a path exists when any file's name starts with it)."""
    directory, name = os.path.split(path)
    return os.path.join(directory, f".{name}.tmp-{socket.gethostname()}-{os.getpid()}")


def WriteText(path: str, text: str) -> None:
    """Writes `text` to `path` through a temporary file and a rename: never half a file.

    The file gets the file system's usual permissions (e.g. 0644 under umask 022).

    Raises:
      LogdirWriteError: the directory cannot be created or the file written.
    """
    tmp = _TempName(path)
    try:
        tf.io.gfile.makedirs(os.path.dirname(path) or ".")
        with tf.io.gfile.GFile(tmp, "w") as f:
            f.write(text)
        tf.io.gfile.rename(tmp, path, overwrite=True)
    except (tf.errors.OpError, OSError) as e:
        _RemoveQuietly(tmp)
        raise LogdirWriteError(f"cannot write {path}: {Reason(e)}") from None


def _RemoveQuietly(path: str) -> None:
    try:
        if tf.io.gfile.exists(path):
            tf.io.gfile.remove(path)
    except (tf.errors.OpError, OSError):
        pass


def _ReadJson(path: str) -> dict | None:
    """The JSON object in `path`; None if it is missing or not a JSON object."""
    try:
        with tf.io.gfile.GFile(path, "r") as f:
            value = json.loads(f.read())
    except (tf.errors.OpError, OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _Now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _Seconds(stamp: str) -> float:
    """Seconds since the epoch of a _Now() stamp (0 if it cannot be read)."""
    try:
        parsed = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S UTC")
    except (TypeError, ValueError):
        return 0.0
    return parsed.replace(tzinfo=datetime.timezone.utc).timestamp()


@dataclasses.dataclass
class RunState:
    """How a run last ended: what a rerun of the same command needs to know.

    status: 'running' (or killed while running), 'stopped' (by a signal, after
      saving a checkpoint), 'failed' (e.g. a non-finite step), 'trained'
      (reached max_steps and saved its final checkpoint).
    step: the step of the newest checkpoint the run saved.
    evaluated_step: the step of the last evaluation written (None: none).
    """

    status: str
    step: int
    max_steps: int
    evaluated_step: int | None = None
    message: str = ""
    updated: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(
                f"RunState: expected status in {STATUSES}, received status={self.status!r}"
            )


def ReadRunState(logdir: str) -> RunState | None:
    """The state recorded in `logdir`; None if there is none or it cannot be read."""
    value = _ReadJson(os.path.join(logdir, RUN_STATE_FILE))
    if value is None:
        return None
    try:
        return RunState(**value)
    except (TypeError, ValueError):
        logging.warning("Ignoring %s: not a run state (%s)", RUN_STATE_FILE, value)
        return None


def WriteRunState(logdir: str, state: RunState) -> None:
    """Records `state` (with the time) in logdir/run_state.json."""
    state = dataclasses.replace(state, updated=_Now())
    text = json.dumps(dataclasses.asdict(state), indent=2, sort_keys=True) + "\n"
    WriteText(os.path.join(logdir, RUN_STATE_FILE), text)


def _IsLocal(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def _PidRuns(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # Runs, as another user.
        return True
    return True


def _CreateExclusively(path: str, text: str) -> bool:
    """Creates `path` holding `text` unless it exists; returns whether it was created."""
    tmp = _TempName(path)
    try:
        with tf.io.gfile.GFile(tmp, "w") as f:
            f.write(text)
        if _IsLocal(path):
            os.link(tmp.removeprefix("file://"), path.removeprefix("file://"))
        else:
            tf.io.gfile.rename(tmp, path, overwrite=False)
    except (FileExistsError, tf.errors.AlreadyExistsError):
        return False
    except (tf.errors.OpError, OSError) as e:
        raise LogdirWriteError(f"cannot write the lock {path}: {Reason(e)}") from None
    finally:
        _RemoveQuietly(tmp)
    # Not atomic on every file system: the last of two writers wins; read back.
    return _ReadJson(path) == json.loads(text)


@contextlib.contextmanager
def _Serialized(logdir: str):
    """While entered, no other process of this host is inside _Serialized(logdir): an
    exclusive flock of the directory (local paths only; nothing elsewhere)."""
    if not _IsLocal(logdir):
        yield
        return
    fd = os.open(logdir.removeprefix("file://"), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # Releases the flock.


class LogdirLock:
    """The logdir's lock, held from Acquire() (or `with`) to Release() (see the module doc).

    Args:
      logdir: the run's directory (created if missing).
      stale_after_s: a lock from another host not confirmed for this long is stale.
      heartbeat_s: how often the holder confirms the lock (0: never).
    """

    def __init__(self, logdir: str, stale_after_s: float = 3600.0, heartbeat_s: float = 60.0):
        self._logdir = logdir
        self._path = os.path.join(logdir, LOCK_FILE)
        self._stale_after_s = stale_after_s
        self._heartbeat_s = heartbeat_s
        self._holder: dict | None = None  # what this process writes in the lock
        self._stop = threading.Event()
        self._writing = threading.Lock()  # held by the heartbeat while it rewrites the lock

    @property
    def path(self) -> str:
        return self._path

    def _Holder(self) -> dict:
        now = _Now()
        return {"host": socket.gethostname(), "pid": os.getpid(), "started": now, "updated": now}

    def _StaleReason(self, holder: dict | None) -> str | None:
        """Why the lock of `holder` is stale, or None if its run may still be running."""
        if holder is None:
            return "the lock file cannot be read"
        host, pid = holder.get("host"), holder.get("pid")
        if host == socket.gethostname():
            if isinstance(pid, int) and not _PidRuns(pid):
                return f"pid {pid} no longer runs on this host"
            return None
        silent_s = time.time() - _Seconds(holder.get("updated", ""))
        if silent_s > self._stale_after_s:
            return (
                f"its holder on host {host} has not confirmed it for {silent_s / 3600:.1f} h "
                f"(stale after {self._stale_after_s / 3600:.1f} h)"
            )
        return None

    def _Refusal(self, holder: dict) -> LogdirLockedError:
        return LogdirLockedError(
            f"--logdir={self._logdir} is in use by another run: pid {holder.get('pid')} on "
            f"host {holder.get('host')}, started {holder.get('started')}. Wait for it to "
            f"end or choose another --logdir; if that run is gone, delete {self._path}"
        )

    @stop_signals.Uninterruptible
    def Acquire(self) -> None:
        """Takes the lock, or takes over a stale one with a warning.

        Raises:
          LogdirLockedError: another run that may still be running holds it.
          LogdirWriteError: the lock cannot be written.
        """
        try:
            tf.io.gfile.makedirs(self._logdir)
        except (tf.errors.OpError, OSError) as e:
            raise LogdirWriteError(f"cannot create {self._logdir}: {Reason(e)}") from None
        # Known before the file can exist: Release recognizes it whenever Acquire stops.
        self._holder = self._Holder()
        with _Serialized(self._logdir):
            self._TakeOrTakeOver(self._holder)
        self._StartHeartbeat()

    def _TakeOrTakeOver(self, mine: dict) -> None:
        """Acquire's work, serialized with other processes' (two that both saw a dead
        holder would otherwise each remove the other's fresh lock and both win)."""
        for _ in range(3):
            if _CreateExclusively(self._path, json.dumps(mine, sort_keys=True)):
                return
            holder = _ReadJson(self._path)
            reason = self._StaleReason(holder)
            if reason is None:
                raise self._Refusal(holder)
            logging.warning("Taking over the lock %s of a run that is gone: %s", self._path, reason)
            _RemoveQuietly(self._path)
        raise LogdirLockedError(
            f"--logdir={self._logdir}: another run took the lock {self._path} at the same time"
        )

    def _StartHeartbeat(self) -> None:
        if not self._heartbeat_s:
            return
        holder = self._holder

        def Beat() -> None:
            while not self._stop.wait(self._heartbeat_s):
                with self._writing:
                    if self._stop.is_set():  # Release came while this waited to write.
                        return
                    holder["updated"] = _Now()
                    try:
                        WriteText(self._path, json.dumps(holder, sort_keys=True))
                    except LogdirWriteError as e:
                        logging.warning("Could not confirm the lock: %s", e)

        threading.Thread(target=Beat, name="logdir-lock", daemon=True).start()

    @stop_signals.Uninterruptible
    def Release(self) -> None:
        """Removes the lock if this process took it (idempotent), whatever the state of
        Acquire and of the heartbeat thread (not started, waiting, writing)."""
        if self._holder is None:
            return
        self._stop.set()
        # Once this holds `_writing`, the heartbeat has seen `_stop` or will before writing.
        with self._writing:
            holder = _ReadJson(self._path) or {}
            # The start time too: a stale lock of an earlier process with this pid is not ours.
            if all(holder.get(k) == self._holder[k] for k in ("host", "pid", "started")):
                _RemoveQuietly(self._path)
            _RemoveQuietly(_TempName(self._path))  # Acquire's, had it stopped before removing it
        self._holder = None

    @stop_signals.Uninterruptible
    def __enter__(self) -> LogdirLock:
        try:
            self.Acquire()
        except BaseException:
            self.Release()  # Stopped (KeyboardInterrupt) or failed after creating the file.
            raise
        return self

    @stop_signals.Uninterruptible
    def __exit__(self, *exc) -> None:
        self.Release()
