"""Checkpoints of a training run: `tf.train.CheckpointManager` with a fallback.

    ckpt = Checkpointer(os.path.join(logdir, 'checkpoints'), task=task,
                        global_step=step_var, train_input=iterator)
    restored = ckpt.Restore()       # path of the checkpoint read, or None (fresh run)
    ...
    ckpt.Save(step)                 # ckpt-<step>, keeping the newest `max_to_keep`

`Restore` tries the newest checkpoint first. If it cannot be read (truncated,
corrupted, written by another model), it warns naming that checkpoint and the
reason and tries the one before it, and so on; only when none can be read does it
raise, naming each one and why. TensorFlow writes each checkpoint under a temporary
name and renames it, and rewrites the `checkpoint` state file atomically, so a run
killed while saving leaves the previous checkpoints intact.

The checkpoints are found from the files themselves when the state file cannot be
trusted: when `checkpoint` is missing, damaged, or older than the newest
`ckpt-N.index` (a run killed between the two writes), the writer (`writable`, the
chief) rebuilds it from the `ckpt-N.index` files with a warning, and a reader uses
that list without writing. The writer also removes the `ckpt-N_temp*` leftovers of a
run killed while saving. A checkpoint that cannot be written (full disk, no
permission) raises `CheckpointError` naming the path and the reason.

A directory whose path holds `[`, `]`, `*`, `?` or `\\` is refused (ValueError):
TensorFlow takes checkpoint paths as globs, so its own readers would find nothing
under `runs/lr[0.1]`, and its `CheckpointManager` would delete other runs'
checkpoints under `runs/lr?` (`glob_paths`; the trainer refuses such a `--logdir`
before it writes anything). The files are listed here all the same, never globbed.
"""

from __future__ import annotations

import logging as py_logging
import os
import re
from typing import Any

import tensorflow as tf
from absl import logging

from lingpipe import glob_paths

__all__ = [
    "Checkpointer",
    "CheckpointError",
    "FindCheckpoints",
    "ReadTasks",
    "RestoreLatest",
    "STATE_FILE",
]

STATE_FILE = "checkpoint"
_INDEX = re.compile(r"ckpt-(\d+)\.index$")
_TEMP = re.compile(r"ckpt-\d+_temp")


class CheckpointError(RuntimeError):
    """No checkpoint in the directory could be read, or one could not be written."""


class _DropShardingLines(py_logging.Filter):
    """TensorFlow's saver logs 'Sharding callback duration' at INFO on every save."""

    def filter(self, record: py_logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Sharding callback duration")


_SHARDING_FILTER = _DropShardingLines()


def _Step(path: str) -> int:
    return int(path.rsplit("-", 1)[1])


def _ListDir(directory: str) -> list[str]:
    """The names in `directory` ([] if it does not exist): listed, never globbed."""
    if not tf.io.gfile.isdir(directory):
        return []
    return [name.rstrip("/") for name in tf.io.gfile.listdir(directory)]


def FindCheckpoints(directory: str) -> list[str]:
    """Paths of the checkpoints whose `ckpt-N.index` file is in `directory`, by step."""
    found = []
    for name in _ListDir(directory):
        match = _INDEX.fullmatch(name)
        if match:
            found.append(os.path.join(directory, f"ckpt-{match.group(1)}"))
    return sorted(found, key=_Step)


def _ListedCheckpoints(directory: str) -> tuple[list[str] | None, str]:
    """The checkpoints the state file lists, or None and why it cannot be trusted."""
    state_path = os.path.join(directory, STATE_FILE)
    if not tf.io.gfile.exists(state_path):
        return None, f"{state_path} is missing"
    tf_logger = tf.get_logger()
    level = tf_logger.level
    tf_logger.setLevel("ERROR")  # It would say only 'Checkpoint ignored'.
    try:
        state = tf.train.get_checkpoint_state(directory)
    finally:
        tf_logger.setLevel(level)
    if state is None or not state.model_checkpoint_path:
        return None, f"{state_path} is damaged (not a checkpoint state)"
    # get_checkpoint_state has joined relative paths to `directory` already.
    return list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path], ""


class Checkpointer:
    """Saves and restores the objects of a run (see the module docstring).

    Args:
      directory: where the checkpoints go (created on the first save).
      max_to_keep: how many of the newest checkpoints to keep.
      **objects: the trackables to save, e.g. task=..., global_step=...

    Raises:
      ValueError: `directory` holds a character TensorFlow reads as a glob.
    """

    def __init__(
        self, directory: str, max_to_keep: int = 5, writable: bool = True, **objects: Any
    ) -> None:
        if problem := glob_paths.Refusal(directory, f"Checkpointer: directory={directory}"):
            raise ValueError(problem)
        self._directory = directory
        self._writable = writable
        logging.get_absl_logger().addFilter(_SHARDING_FILTER)
        if writable:
            self._RemoveTempLeftovers()
        recovered = self._RecoverState()
        self._checkpoint = tf.train.Checkpoint(**objects)
        self._manager = tf.train.CheckpointManager(
            self._checkpoint, directory, max_to_keep=max_to_keep
        )
        self._recovered = None if writable else recovered

    def _RemoveTempLeftovers(self) -> None:
        """Removes the `ckpt-N_temp*` files of a save that was killed halfway."""
        for name in _ListDir(self._directory):
            if not _TEMP.match(name):
                continue
            path = os.path.join(self._directory, name)
            logging.info("Removing %s, left by a run killed while saving a checkpoint", path)
            if tf.io.gfile.isdir(path):
                tf.io.gfile.rmtree(path)
            else:
                tf.io.gfile.remove(path)

    def _RecoverState(self) -> list[str] | None:
        """When the state file is missing, damaged or stale but `ckpt-N.index` files are
        there: the checkpoints found, with a warning (and, if writable, a new state file)."""
        found = FindCheckpoints(self._directory)
        if not found:
            return None
        listed, why = _ListedCheckpoints(self._directory)
        if listed is not None:
            if _Step(listed[-1]) >= _Step(found[-1]):
                return None
            why = (
                f"the newest checkpoint {found[-1]} is not in {STATE_FILE} "
                "(a run killed while saving)"
            )
        names = ", ".join(os.path.basename(p) for p in found)
        if self._writable:
            tf.__internal__.train.update_checkpoint_state(
                self._directory,
                os.path.basename(found[-1]),
                [os.path.basename(p) for p in found],
                save_relative_paths=True,
                all_model_checkpoint_timestamps=[
                    tf.io.gfile.stat(p + ".index").mtime_nsec / 1e9 for p in found
                ],
            )
        logging.warning(
            "%s; %s the checkpoint list from the checkpoint files: %s",
            why,
            "rebuilt" if self._writable else "read",
            names,
        )
        return found

    @property
    def directory(self) -> str:
        return self._directory

    @property
    def checkpoints(self) -> list[str]:
        """Paths of the kept checkpoints, oldest first."""
        if self._recovered is not None:
            return list(self._recovered)
        return list(self._manager.checkpoints)

    @property
    def latest(self) -> str | None:
        found = self.checkpoints
        return found[-1] if found else None

    def Restore(self, partial: bool = False) -> str | None:
        """Restores the newest readable checkpoint; returns its path, or None if there is none.

        `partial`: the checkpoint may hold values these objects do not (evaluation and
        export read a training checkpoint without the optimizer's slots); TensorFlow
        would warn of each of them once the objects are deleted.

        Raises:
          CheckpointError: there are checkpoints but none of them can be read.
        """
        candidates = list(reversed(self.checkpoints))
        failures = []
        for path in candidates:
            try:
                status = self._checkpoint.restore(path)
                status.assert_existing_objects_matched()
                if partial:
                    status.expect_partial()
            except Exception as e:  # noqa: BLE001 (any unreadable checkpoint means: try the next)
                reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                failures.append((path, reason))
                following = candidates[len(failures)] if len(failures) < len(candidates) else None
                logging.warning(
                    "Checkpoint %s cannot be read (%s); %s",
                    path,
                    reason,
                    f"falling back to the one before it, {following}"
                    if following
                    else "and there is no earlier one",
                )
                continue
            if failures:
                logging.warning(
                    "Resumed from %s instead of the newest checkpoint %s, which cannot be read",
                    path,
                    failures[0][0],
                )
            return path
        if failures:
            raise CheckpointError(
                f"None of the {len(failures)} checkpoint(s) in {self._directory} can be read: "
                + "; ".join(f"{p} ({r})" for p, r in failures)
                + ". Move them away to start afresh, or point --logdir elsewhere."
            )
        return None

    def Save(self, step: int) -> str:
        """Writes checkpoint ckpt-<step>; returns its path.

        Raises:
          CheckpointError: it cannot be written (full disk, no permission, ...).
        """
        if not self._writable:
            raise ValueError(f"Checkpointer({self._directory}): Save on a read-only checkpointer")
        try:
            return self._manager.save(checkpoint_number=step)
        except (tf.errors.OpError, OSError) as e:
            reason = getattr(e, "message", None) or getattr(e, "strerror", None) or str(e)
            raise CheckpointError(
                f"cannot write checkpoint {os.path.join(self._directory, f'ckpt-{step}')}: "
                f"{reason.splitlines()[0]}. The previous checkpoints are intact (latest: "
                f"{self.latest}); free space or fix {self._directory}, then rerun to resume"
            ) from None


def RestoreLatest(directory: str, tasks: list) -> int | None:
    """Restores the newest readable checkpoint's weights into every task; returns its step.

    For evaluation: the optimizer's slots are left out. None if there is no checkpoint.
    """
    global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    reader = Checkpointer(directory, writable=False, task=tasks[0], global_step=global_step)
    path = reader.Restore(partial=True)
    if path is None:
        return None
    ReadTasks(path, tasks[1:])
    return int(global_step.numpy())


def ReadTasks(path: str, tasks: list) -> None:
    """Reads the task of checkpoint `path` into each of `tasks` (copies of one task)."""
    for task in tasks:
        tf.train.Checkpoint(task=task).read(path).expect_partial()
