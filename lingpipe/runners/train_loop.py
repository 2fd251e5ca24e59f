"""The train loop: one step function for every `tf.distribute` strategy.

Each step runs inside one `tf.function` through `strategy.run`. Per replica:

    metrics, grads = task.ComputeGradients(batch, step)    # the micro-batch pipeline
    grads = all_reduce(MEAN, grads)                         # skipped with one replica
    metrics = weighted mean of the metrics over replicas
    task.ApplyGradients(grads, step)                        # clip, then apply once

With the default strategy (one replica) this is the single-host path. The host
loop reads the step's metrics, stops with `NonFiniteError` (naming the step and
the first variable whose gradient is not finite) before anything more is saved,
writes summaries, the progress line and checkpoints, and calls the evaluators.

Step numbers are counts of finished steps, as Lingvo's global step: step 1 is the
first, and checkpoint ckpt-N holds the weights after N steps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
from absl import logging

from lingpipe.models import base_task
from lingpipe.nested_map import NestedMap
from lingpipe.runners import checkpointer, progress


class NonFiniteError(RuntimeError):
    """A step's loss or gradient was NaN or infinite."""


class ClusterError(RuntimeError):
    """A step failed in the runtime: a worker or device of the run went away."""


# Errors of a step that mean a peer (another worker) failed, not a bug in the model.
_CLUSTER_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.DeadlineExceededError,
    tf.errors.AbortedError,
    tf.errors.CancelledError,
)


@dataclasses.dataclass
class Intervals:
    """How often the loop does its chores (0 turns a chore off; the end always saves)."""

    log_steps: int = 100
    summary_steps: int = 10
    checkpoint_steps: int = 100
    eval_steps: int = 0
    progress_seconds: float = 5.0


def WeightedSums(metrics: NestedMap) -> dict[str, tf.Tensor]:
    """{name: [value * weight, weight]} of (value, weight) metrics: sums of these over
    replicas or batches give each metric's weighted mean (sum[0] / sum[1])."""
    return {
        name: tf.stack([tf.cast(v * w, tf.float32), tf.cast(w, tf.float32)])
        for name, (v, w) in metrics.items()
    }


def ReduceMetrics(metrics: NestedMap) -> NestedMap:
    """In a replica: each (value, weight) metric's weighted mean and total weight over replicas."""
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return metrics
    sums = ctx.all_reduce(tf.distribute.ReduceOp.SUM, WeightedSums(metrics))
    return NestedMap({n: (s[0] / tf.maximum(s[1], 1e-30), s[1]) for n, s in sums.items()})


def ReduceGradients(grads: list[tf.Tensor | None]) -> list[tf.Tensor | None]:
    """In a replica: the mean of each gradient over the replicas (as is with one replica)."""
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return grads
    present = [i for i, g in enumerate(grads) if g is not None]
    reduced = ctx.all_reduce(
        tf.distribute.ReduceOp.MEAN, [tf.convert_to_tensor(grads[i]) for i in present]
    )
    out = list(grads)
    for i, g in zip(present, reduced):
        out[i] = g
    return out


def LocalReplicas(strategy: tf.distribute.Strategy) -> int:
    """How many replicas of `strategy` run in this process."""
    try:
        return len(strategy.extended.worker_devices)
    except RuntimeError:  # The default strategy: one.
        return 1


def ReplicaTask(tasks: list, strategy: tf.distribute.Strategy):
    """In a replica: this replica's copy of the task (see strategies.Layout)."""
    if len(tasks) == 1:
        return tasks[0]
    # The replica's id is a constant in each replica's trace; the local replicas of a
    # worker have consecutive ids (every worker runs as many).
    ctx = tf.distribute.get_replica_context()
    replica_id = tf.get_static_value(ctx.replica_id_in_sync_group)
    if replica_id is None:
        raise ValueError(
            f"ReplicaTask: {len(tasks)} task copies need the replica id at trace time, "
            f"but {type(strategy).__name__} gives it only at run time"
        )
    return tasks[int(replica_id) % len(tasks)]


def _AllFinite(grads: list[tf.Tensor | None]) -> tf.Tensor:
    """[num_grads] bools: whether each gradient is all finite (checked on its device)."""
    flags = []
    for g in grads:
        if g is None:
            flags.append(tf.constant(True))
            continue
        with tf.device(g.device):
            flags.append(tf.reduce_all(tf.math.is_finite(g)))
    return tf.stack(flags)


def MakeTrainStep(
    tasks: list[base_task.BaseTask],
    strategy: tf.distribute.Strategy,
    apply_in_replica: bool = False,
    replica_context: Callable[[], Any] | None = None,
) -> Callable:
    """Returns step(iterator, step) -> (metrics, finite): one synchronous training step.

    `tasks[r]` is local replica r's copy of the task (one task for one replica).
    Gradients are computed and reduced inside `strategy.run`; each copy then
    applies the same reduced gradients to its own weights, so the copies stay equal.
    With `apply_in_replica` (one task whose variables the strategy distributes, as
    on TPU) the task applies them inside the replica instead.
    `replica_context()`, if given, is entered around each replica's forward and
    backward (the TPU's logical-core placement).
    `metrics` is a NestedMap of (value, weight) pairs, the same on every replica;
    `finite[i]` says whether the reduced gradient of `tasks[0].trainable_variables[i]`
    is all finite.
    """
    if apply_in_replica and len(tasks) != 1:
        raise ValueError(
            f"MakeTrainStep: apply_in_replica needs one task, received {len(tasks)} copies"
        )

    def ReplicaStep(batch: NestedMap, step: tf.Tensor):
        task = ReplicaTask(tasks, strategy)
        with replica_context() if replica_context else contextlib.nullcontext():
            metrics, grads = task.ComputeGradients(batch, step)
        metrics, grads = ReduceMetrics(metrics), ReduceGradients(grads)
        finite = _AllFinite(grads)
        if apply_in_replica:
            metrics.update(task.ApplyGradients(grads, step))
            return metrics, finite, []
        return metrics, finite, grads

    # AutoGraph is off: it would only double the trace time of the pipeline's
    # Python loops, which must unroll anyway.
    @tf.function(autograph=False)
    def Step(iterator, step):
        batch = next(iterator)
        metrics, finite, grads = strategy.run(ReplicaStep, args=(batch, step))
        first = lambda v: strategy.experimental_local_results(v)[0]  # noqa: E731
        metrics, finite = tf.nest.map_structure(first, (metrics, finite))
        if not apply_in_replica:
            local_grads = [strategy.experimental_local_results(g) for g in grads]
            for r, task in enumerate(tasks):
                applied = task.ApplyGradients([g[r] for g in local_grads], step)
                if r == 0:
                    metrics.update(applied)
        return metrics, finite

    return Step


def Fingerprint(task: base_task.BaseTask) -> str:
    """A short hash of the task's weights: equal on workers whose weights are bitwise equal."""
    digest = hashlib.sha256()
    for v in task.trainable_variables:
        digest.update(v.name.encode())
        digest.update(np.ascontiguousarray(v.numpy()).tobytes())
    return digest.hexdigest()[:16]


def _Scalars(metrics: NestedMap) -> dict[str, float]:
    return {name: float(value) for name, (value, _) in sorted(metrics.items())}


class Trainer:
    """Runs training steps with summaries, progress, checkpoints and evaluation.

    Args:
      tasks: the copies of the task, one per local replica of `strategy`, each with
        its optimizer created; the first is the one checkpointed and restored into all.
      strategy: the `tf.distribute` strategy that runs the replicas.
      train_input: the training input generator (`batch_size` is the global batch).
      logdir: where summaries (logdir/train) and checkpoints (logdir/checkpoints) go.
      intervals: how often to log, summarise, checkpoint and evaluate.
      evaluate: called with the step number at eval intervals and at the end.
      checkpoint_dir: where checkpoints go (default logdir/checkpoints).
      max_to_keep: how many of the newest checkpoints to keep.
      is_chief: whether this process writes checkpoints and summaries; the other
        workers of a multi-worker run only read the chief's checkpoints.
      apply_in_replica, replica_context: see MakeTrainStep (TPU: one task whose
        variables the strategy distributes, stages annotated with logical cores).
    """

    def __init__(
        self,
        tasks: list[base_task.BaseTask],
        strategy: tf.distribute.Strategy,
        train_input,
        logdir: str,
        intervals: Intervals,
        evaluate: Callable[[int], None] | None = None,
        checkpoint_dir: str | None = None,
        max_to_keep: int = 5,
        is_chief: bool = True,
        apply_in_replica: bool = False,
        replica_context: Callable[[], Any] | None = None,
    ) -> None:
        self._tasks = list(tasks)
        self._task = self._tasks[0]
        self._strategy = strategy
        self._input = train_input
        self._logdir = logdir
        self._intervals = intervals
        self._evaluate = evaluate
        self._is_chief = is_chief
        if not apply_in_replica and len(self._tasks) != LocalReplicas(strategy):
            raise ValueError(
                f"Trainer: expected one task copy per local replica of the strategy "
                f"({LocalReplicas(strategy)}), received {len(self._tasks)}"
            )
        self._global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self._checkpointer = checkpointer.Checkpointer(
            checkpoint_dir or os.path.join(logdir, "checkpoints"),
            task=self._task,
            max_to_keep=max_to_keep,
            global_step=self._global_step,
        )
        self._step_fn = MakeTrainStep(self._tasks, strategy, apply_in_replica, replica_context)

    @property
    def checkpointer(self) -> checkpointer.Checkpointer:
        return self._checkpointer

    @property
    def global_step(self) -> int:
        return int(self._global_step.numpy())

    def _Restore(self) -> str | None:
        """Restores the newest readable checkpoint into every task copy."""
        path = self._checkpointer.Restore()
        if path is not None:
            checkpointer.ReadTasks(path, self._tasks[1:])
        return path

    def _Iterator(self, start_step: int):
        # Each input pipeline (one per worker) feeds its local replicas one batch each
        # per step.
        local_replicas = LocalReplicas(self._strategy)

        def DatasetFn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
            return self._input.GetDataset(ctx, start_batch=start_step * local_replicas)

        return iter(self._strategy.distribute_datasets_from_function(DatasetFn))

    def _CheckFinite(self, step: int, metrics: NestedMap, finite: np.ndarray) -> None:
        loss = float(metrics.loss[0])
        if math.isfinite(loss) and finite.all():
            return
        bad_vars = [v.name for v, ok in zip(self._task.trainable_variables, finite) if not bool(ok)]
        last = self._checkpointer.latest
        raise NonFiniteError(
            f"Step {step}: the loss is {loss} and {len(bad_vars)} of "
            f"{len(finite)} gradients are not finite"
            + (f"; the first is that of {bad_vars[0]}" if bad_vars else "")
            + ". Training stopped before saving anything of this step; the last good "
            + (f"checkpoint is {last}." if last else "state was never checkpointed.")
            + " Lower train.learning_rate, set train.clip_gradient_norm_to_value, or "
            "check the input."
        )

    def Train(self) -> dict[str, float]:
        """Trains from the latest checkpoint (or from scratch) to train.max_steps.

        Returns the last step's metrics (empty if there was nothing left to do).
        """
        max_steps = self._task.params.train.max_steps
        restored = self._Restore()
        start = self.global_step
        if restored:
            logging.info("Resumed from %s at step %d of %d", restored, start, max_steps)
        if start >= max_steps:
            logging.info("Nothing to train: step %d already reached max_steps=%d", start, max_steps)
            return {}
        iterator = self._Iterator(start)
        writer = (
            tf.summary.create_file_writer(os.path.join(self._logdir, "train"))
            if self._is_chief
            else tf.summary.create_noop_writer()
        )
        iv = self._intervals
        batch_size = self._input.params.batch_size
        bar = progress.Progress(max_steps, stream=sys.stderr, interval_s=iv.progress_seconds)
        bar.Start(start)
        last_time, last_step, scalars = time.monotonic(), start, {}
        try:
            for step in range(start + 1, max_steps + 1):
                try:
                    metrics, finite = self._step_fn(iterator, tf.constant(step - 1, tf.int64))
                    finite = finite.numpy()
                except _CLUSTER_ERRORS as e:
                    last = self._checkpointer.latest
                    raise ClusterError(
                        f"Step {step} failed: {type(e).__name__}: {e.message.splitlines()[0]}. "
                        "A worker of the run is gone or unreachable. The checkpoints are "
                        f"intact (latest: {last}); restart every worker with the same command "
                        "to resume from it."
                    ) from None
                self._CheckFinite(step, metrics, finite)
                self._global_step.assign(step)
                scalars = _Scalars(metrics)
                bar.Update(step, scalars["loss"], examples_per_step=batch_size)
                if iv.summary_steps and step % iv.summary_steps == 0 or step == max_steps:
                    now = time.monotonic()
                    rate = (step - last_step) / max(now - last_time, 1e-9)
                    last_time, last_step = now, step
                    with writer.as_default(step=step):
                        for name, value in scalars.items():
                            tf.summary.scalar(name, value)
                        tf.summary.scalar("steps_per_sec", rate)
                        tf.summary.scalar("examples_per_sec", rate * batch_size)
                    writer.flush()
                if iv.log_steps and step % iv.log_steps == 0:
                    bar.Close()  # Log lines start on their own line, not after the bar.
                    logging.info(
                        "step %d/%d %s",
                        step,
                        max_steps,
                        " ".join(f"{k}={v:.6g}" for k, v in scalars.items()),
                    )
                if iv.checkpoint_steps and step % iv.checkpoint_steps == 0 or step == max_steps:
                    bar.Close()
                    if self._is_chief:
                        logging.info("Saved %s", self._checkpointer.Save(step))
                if self._evaluate and (
                    iv.eval_steps and step % iv.eval_steps == 0 or step == max_steps
                ):
                    bar.Close()
                    self._evaluate(step)
        finally:
            bar.Close()
            writer.close()
        return scalars
