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
name and renames it, and rewrites the `checkpoint` index file atomically, so a run
killed while saving leaves the previous checkpoints intact.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from absl import logging


class CheckpointError(RuntimeError):
    """No checkpoint in the directory could be read."""


class Checkpointer:
    """Saves and restores the objects of a run (see the module docstring).

    Args:
      directory: where the checkpoints go (created on the first save).
      max_to_keep: how many of the newest checkpoints to keep.
      **objects: the trackables to save, e.g. task=..., global_step=...
    """

    def __init__(self, directory: str, max_to_keep: int = 5, **objects: Any) -> None:
        self._directory = directory
        self._checkpoint = tf.train.Checkpoint(**objects)
        self._manager = tf.train.CheckpointManager(
            self._checkpoint, directory, max_to_keep=max_to_keep
        )

    @property
    def directory(self) -> str:
        return self._directory

    @property
    def checkpoints(self) -> list[str]:
        """Paths of the kept checkpoints, oldest first."""
        return list(self._manager.checkpoints)

    @property
    def latest(self) -> str | None:
        return self._manager.latest_checkpoint

    def Restore(self) -> str | None:
        """Restores the newest readable checkpoint; returns its path, or None if there is none.

        Raises:
          CheckpointError: there are checkpoints but none of them can be read.
        """
        candidates = list(reversed(self._manager.checkpoints))
        failures = []
        for path in candidates:
            try:
                self._checkpoint.restore(path).assert_existing_objects_matched()
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
        """Writes checkpoint ckpt-<step>; returns its path."""
        return self._manager.save(checkpoint_number=step)


def RestoreLatest(directory: str, tasks: list) -> int | None:
    """Restores the newest readable checkpoint's weights into every task; returns its step.

    For evaluation: the optimizer's slots are left out. None if there is no checkpoint.
    """
    global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    path = Checkpointer(directory, task=tasks[0], global_step=global_step).Restore()
    if path is None:
        return None
    ReadTasks(path, tasks[1:])
    return int(global_step.numpy())


def ReadTasks(path: str, tasks: list) -> None:
    """Reads the task of checkpoint `path` into each of `tasks` (copies of one task)."""
    for task in tasks:
        tf.train.Checkpoint(task=task).read(path).expect_partial()
