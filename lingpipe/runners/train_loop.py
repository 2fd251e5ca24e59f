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
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf
from absl import logging

from lingpipe.models import base_task
from lingpipe.nested_map import NestedMap
from lingpipe.runners import checkpointer, progress, rundir, step_deadline

# Re-exported: the trainer and tests name them as train_loop's.
from lingpipe.runners.stop_signals import StopBeforeSteps, Stopped, StopSignals  # noqa: F401

__all__ = [
    "ClusterError",
    "Fingerprint",
    "FIRST_STEP_FACTOR",
    "HungError",
    "Intervals",
    "LocalReplicas",
    "MakeTrainStep",
    "NonFiniteError",
    "ProfileSteps",
    "ReduceGradients",
    "ReduceMetrics",
    "ReduceOnGradientDevices",
    "ReplicaTask",
    "StepHungError",
    "StepResult",
    "Trainer",
    "WeightedSums",
]

# The run's first step traces the step function: its deadline is this many times longer.
FIRST_STEP_FACTOR = 5


class NonFiniteError(RuntimeError):
    """A step's loss or gradient was NaN or infinite."""


class ClusterError(RuntimeError):
    """A step failed in the runtime: a worker or device of the run went away."""


class StepHungError(ClusterError):
    """A step did not finish within its deadline (the message names the step)."""


def HungError(work: str, timeout_s: float, latest: str | None) -> StepHungError:
    """The error of `work` ('Step 7', 'Writing checkpoint ckpt-5') that did not finish
    within `timeout_s`; `latest`: the newest checkpoint."""
    return StepHungError(
        f"{work} did not finish within {timeout_s:g} s (--step_timeout_s): a device or "
        f"worker of the run hangs. The checkpoints are intact (latest: {latest}); fix or "
        "restart it and rerun the same command to resume."
    )


# Errors of a step that mean a peer (another worker) failed, not a bug in the model.
_CLUSTER_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.DeadlineExceededError,
    tf.errors.AbortedError,
    tf.errors.CancelledError,
)


@dataclasses.dataclass(frozen=True)
class ProfileSteps:
    """Profile steps `first`..`last` (1-based, inclusive) with TensorFlow's profiler.

    The trace goes to `<logdir>/plugins/profile/` (TensorBoard's Profile tab);
    `begin()` is called before the first recorded step (to reset the memory peaks,
    say), `done(logdir, steps)` after the last with the steps recorded (lingpipe's
    timeline is made from the trace there).
    """

    first: int
    last: int
    done: Callable[[str, list[int]], None] | None = None
    begin: Callable[[], None] | None = None


class _Profiler:
    """Starts the profiler before ProfileSteps.first and stops it after .last (or at
    the run's last step); the chief only, as it writes into the logdir."""

    def __init__(self, profile: ProfileSteps | None, logdir: str, enabled: bool) -> None:
        self._profile = profile if enabled else None
        self._logdir = logdir
        self._steps: list[int] | None = None  # the steps recorded while active

    def Before(self, step: int) -> None:
        p = self._profile
        if p is None or self._steps is not None or not p.first <= step <= p.last:
            return
        if step > p.first:
            logging.warning("Profiling from step %d: the run resumed after step %d", step, p.first)
        if p.begin is not None:
            p.begin()
        tf.profiler.experimental.start(self._logdir)
        self._steps = []

    def After(self, step: int, last: bool) -> None:
        if self._steps is None:
            return
        self._steps.append(step)
        if step >= self._profile.last or last:
            steps, self._steps = self._steps, None
            done, self._profile = self._profile.done, None  # once per run
            tf.profiler.experimental.stop()
            logging.info("Profiled steps %s into %s/plugins/profile", steps, self._logdir)
            if done is not None:
                done(self._logdir, steps)

    def Close(self) -> None:
        """Stops a profile that a failed or stopped step left running."""
        if self._steps is not None:
            self._steps = None
            tf.profiler.experimental.stop()


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
    return _OverPresent(grads, lambda present: ctx.all_reduce(tf.distribute.ReduceOp.MEAN, present))


def _OverPresent(grads: list, reduce: Callable[[list], list]) -> list:
    """`grads` with the gradients that are not None replaced by reduce(those, as tensors)."""
    present = [i for i, g in enumerate(grads) if g is not None]
    out = list(grads)
    for i, g in zip(present, reduce([tf.convert_to_tensor(grads[i]) for i in present])):
        out[i] = g
    return out


def ReduceOnGradientDevices(grads: list[tf.Tensor | None]) -> list[tf.Tensor | None]:
    """In a replica: the mean of each gradient over the replicas, as ReduceGradients,
    computed where replica 0's copy of the gradient lives and copied to where each
    replica's copy lives.

    For pipelines whose stages live on other hosts (strategies.HostsLayout): the
    strategy's replica devices are the client's, so its own all-reduce would send
    every gradient to the client and back. Here stage k's gradients travel only
    between the devices of the replicas' stage k.
    """
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return grads

    def Mean(strategy: tf.distribute.Strategy, *per_replica) -> list:
        means = []  # means[i][r]: the mean of gradient i on replica r's device of it
        for value in per_replica:
            copies = strategy.experimental_local_results(value)
            with tf.device(copies[0].device):
                total = tf.add_n(list(copies)) / len(copies)
            placed = []
            for copy in copies:
                with tf.device(copy.device):
                    placed.append(tf.identity(total))
            means.append(placed)
        return strategy.experimental_distribute_values_from_function(
            lambda value_ctx: [m[value_ctx.replica_id_in_sync_group] for m in means]
        )

    return _OverPresent(grads, lambda present: ctx.merge_call(Mean, args=tuple(present)))


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


def _AllFinite(tensors: list[tf.Tensor | None]) -> tf.Tensor:
    """[num_tensors] bools: whether each tensor is all finite (checked on its device)."""
    flags = []
    for g in tensors:
        if g is None:
            flags.append(tf.constant(True))
            continue
        with tf.device(g.device):
            flags.append(tf.reduce_all(tf.math.is_finite(g)))
    return tf.stack(flags)


def _WeightsFinite(task: base_task.BaseTask) -> tf.Tensor:
    """[num_weights] bools: whether each trainable weight is all finite, read (after the
    update, which the function's automatic control dependencies order first) on its
    own device."""
    flags = []
    for v in task.trainable_variables:
        with tf.device(v.device):
            flags.append(tf.reduce_all(tf.math.is_finite(v)))
    return tf.stack(flags)


def _AgreeToStop(stop: tf.Tensor, strategy: tf.distribute.Strategy) -> tf.Tensor:
    """In a replica: whether any worker was asked to stop (workers must stop together,
    or the others would wait for this one in the next step's all-reduce)."""
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync <= LocalReplicas(strategy):
        return stop  # One worker: every replica saw the same signal.
    return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.cast(stop, tf.float32)) > 0


def MakeTrainStep(
    tasks: list[base_task.BaseTask],
    strategy: tf.distribute.Strategy,
    apply_in_replica: bool = False,
    replica_context: Callable[[], Any] | None = None,
    reduce_gradients: Callable[[list], list] = ReduceGradients,
) -> Callable:
    """Returns step(iterator, step, stop) -> StepResult: one synchronous training step.

    `tasks[r]` is local replica r's copy of the task (one task for one replica).
    Gradients are computed and reduced inside `strategy.run`; each copy then
    applies the same reduced gradients to its own weights, so the copies stay equal.
    With `apply_in_replica` (one task whose variables the strategy distributes, as
    on TPU) the task applies them inside the replica instead.
    `replica_context()`, if given, is entered around each replica's forward and
    backward (the TPU's logical-core placement).
    `reduce_gradients` averages the gradients over the replicas, in a replica
    (ReduceGradients: the strategy's all-reduce; ReduceOnGradientDevices).
    `stop` (a bool tensor) says whether this process was asked to stop; the result's
    `stop` says whether any worker was.
    """
    if apply_in_replica and len(tasks) != 1:
        raise ValueError(
            f"MakeTrainStep: apply_in_replica needs one task, received {len(tasks)} copies"
        )

    def ReplicaStep(batch: NestedMap, step: tf.Tensor, stop: tf.Tensor):
        task = ReplicaTask(tasks, strategy)
        with replica_context() if replica_context else contextlib.nullcontext():
            metrics, grads = task.ComputeGradients(batch, step)
        metrics, grads = ReduceMetrics(metrics), reduce_gradients(grads)
        finite, stop = _AllFinite(grads), _AgreeToStop(stop, strategy)
        if apply_in_replica:
            metrics.update(task.ApplyGradients(grads, step))
            return metrics, finite, _WeightsFinite(task), stop, []
        return metrics, finite, tf.constant([True]), stop, grads

    # AutoGraph is off: it would only double the trace time of the pipeline's
    # Python loops, which must unroll anyway.
    @tf.function(autograph=False)
    def Step(iterator, step, stop=False):
        batch = next(iterator)
        out = strategy.run(ReplicaStep, args=(batch, step, tf.convert_to_tensor(stop, tf.bool)))
        first = lambda v: strategy.experimental_local_results(v)[0]  # noqa: E731
        metrics, finite, weights_finite, stop = tf.nest.map_structure(first, out[:4])
        if not apply_in_replica:
            local_grads = [strategy.experimental_local_results(g) for g in out[4]]
            for r, task in enumerate(tasks):
                applied = task.ApplyGradients([g[r] for g in local_grads], step)
                if r == 0:
                    metrics.update(applied)
            weights_finite = _WeightsFinite(tasks[0])
        return StepResult(metrics, finite, weights_finite, stop)

    return Step


class StepResult(NamedTuple):
    """What a training step returns.

    metrics: NestedMap of (value, weight) pairs, the same on every replica.
    grads_finite: [num_weights] bools: whether the reduced gradient of
      `tasks[0].trainable_variables[i]` is all finite.
    weights_finite: [num_weights] bools: whether weight i is all finite after the update.
    stop: whether any worker was asked to stop (SIGTERM, SIGINT).
    """

    metrics: NestedMap
    grads_finite: tf.Tensor
    weights_finite: tf.Tensor
    stop: tf.Tensor


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
      logdir: where summaries (logdir/train), checkpoints (logdir/checkpoints) and
        the run's state (rundir.RUN_STATE_FILE) go; any `tf.io.gfile` path.
      intervals: how often to log, summarise, checkpoint and evaluate.
      evaluate: called at eval intervals and at the end with the step number and a
        `bound(fn, work, first)` that runs one batch's `fn` under the step deadline
        (evaler.Evaler.Evaluate takes it).
      checkpoint_dir: where checkpoints go (default logdir/checkpoints).
      max_to_keep: how many of the newest checkpoints to keep.
      is_chief: whether this process writes checkpoints, summaries and the run state;
        the other workers of a multi-worker run only read the chief's checkpoints.
      apply_in_replica, replica_context: see MakeTrainStep (TPU: one task whose
        variables the strategy distributes, stages annotated with logical cores).
      reduce_gradients: see MakeTrainStep (stages on other hosts: on their devices).
      profile: steps to record with TensorFlow's profiler (chief only), or None.
      params_text: the run's params as text, written once at the start of Train as
        the text summary `params` in logdir/train (chief only), or None.
      watch: an object whose Before(step) and After(step, last) run around each
        step's work, timing it (plan_flags.PlanCheck), or None.
    """

    def __init__(
        self,
        tasks: list[base_task.BaseTask],
        strategy: tf.distribute.Strategy,
        train_input,
        logdir: str,
        intervals: Intervals,
        evaluate: Callable[[int, Callable], None] | None = None,
        checkpoint_dir: str | None = None,
        max_to_keep: int = 5,
        is_chief: bool = True,
        apply_in_replica: bool = False,
        replica_context: Callable[[], Any] | None = None,
        reduce_gradients: Callable[[list], list] = ReduceGradients,
        profile: ProfileSteps | None = None,
        params_text: str | None = None,
        watch: Any = None,
    ) -> None:
        self._tasks = list(tasks)
        self._watch = watch
        self._profiler = _Profiler(profile, logdir, is_chief)
        self._params_text = params_text
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
            max_to_keep=max_to_keep,
            writable=is_chief,
            task=self._task,
            global_step=self._global_step,
        )
        self._step_fn = MakeTrainStep(
            self._tasks, strategy, apply_in_replica, replica_context, reduce_gradients
        )
        self._max_steps = self._task.params.train.max_steps
        self._saved_step: int | None = None  # the newest checkpoint's step
        self._evaluated_step: int | None = None
        self._multi_worker = strategy.num_replicas_in_sync > LocalReplicas(strategy)
        self._step_timeout_s: float | None = None
        self._first_step = 1  # of this run: it traces the step function
        self._signals: StopSignals | None = None

    @property
    def checkpointer(self) -> checkpointer.Checkpointer:
        return self._checkpointer

    @property
    def global_step(self) -> int:
        return int(self._global_step.numpy())

    def _Restore(self) -> int:
        """Restores the newest readable checkpoint into every task copy; returns its step."""
        path = self._checkpointer.Restore()
        if path is not None:
            checkpointer.ReadTasks(path, self._tasks[1:])
            logging.info(
                "Resumed from %s at step %d of %d", path, self.global_step, self._max_steps
            )
            self._saved_step = self.global_step
        return self.global_step

    def _Record(self, status: str, message: str = "") -> None:
        """The chief records the run's state (see rundir.RunState)."""
        if not self._is_chief:
            return
        state = rundir.RunState(
            status=status,
            step=self._saved_step or 0,
            max_steps=self._max_steps,
            evaluated_step=self._evaluated_step,
            message=message,
        )
        rundir.WriteRunState(self._logdir, state)

    def _Evaluate(self, step: int, status: str) -> None:
        # Each batch reads every weight from its device, as a step does: bounded like one.
        self._evaluate(
            step,
            lambda fn, work, first: self._Between(fn, work, FIRST_STEP_FACTOR if first else 1),
        )
        self._evaluated_step = step
        self._Record(status)

    def _CompleteFinished(self, step: int) -> None:
        """A rerun of a run that reached max_steps: evaluates if it was not, else says so."""
        state = rundir.ReadRunState(self._logdir)
        self._evaluated_step = state.evaluated_step if state else None
        if self._evaluate is not None and self._evaluated_step != step:
            logging.info(
                "Training reached max_steps=%d, but the run ended before evaluating step %d: "
                "evaluating it now",
                self._max_steps,
                step,
            )
            self._Evaluate(step, "trained")
            return
        logging.info(
            "Nothing to do: the run already trained to step %d (max_steps=%d)%s",
            step,
            self._max_steps,
            " and evaluated it" if self._evaluate is not None else "",
        )

    def _Iterator(self, start_step: int):
        # Each input pipeline (one per worker) feeds its local replicas one batch each
        # per step.
        local_replicas = LocalReplicas(self._strategy)

        def DatasetFn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
            return self._input.GetDataset(ctx, start_batch=start_step * local_replicas)

        return iter(self._strategy.distribute_datasets_from_function(DatasetFn))

    def SetStepTimeout(self, timeout_s: float | None) -> None:
        """Each step must finish within `timeout_s` seconds (the run's first, which
        traces, within FIRST_STEP_FACTOR times that), or the run fails naming it (see
        step_deadline); None or 0: steps may take for ever."""
        self._step_timeout_s = timeout_s or None

    def _StepHung(self, work: str, timeout_s: float) -> StepHungError:
        """The error of `work` ('Step 7', 'Writing checkpoint ckpt-5') that did not finish
        in time (HostsTrainer names the host)."""
        return HungError(work, timeout_s, self._checkpointer.latest)

    def _RunStep(self, iterator, step: int, stop: bool) -> StepResult:
        """Step `step` (1-based), with the results on the host as numpy."""

        def Step() -> StepResult:
            result = self._step_fn(iterator, tf.constant(step - 1, tf.int64), tf.constant(stop))
            return StepResult(
                result.metrics,
                result.grads_finite.numpy(),
                result.weights_finite.numpy(),
                bool(result.stop),
            )

        factor = FIRST_STEP_FACTOR if step == self._first_step else 1
        signalled = lambda: self._signals.received if self._signals else None  # noqa: E731
        return self._Guarded(
            lambda: self._WithDeadline(
                Step,
                signalled,
                f"Step {step}",
                factor,
                f"step {step} waited",
                "nothing of it was saved",
            ),
            step,
        )

    def _WithDeadline(
        self,
        fn: Callable,
        signalled: Callable[[], str | None],
        work: str,
        factor: float,
        waiting: str,
        lost: str,
    ):
        """fn() within `factor` x --step_timeout_s, hearing signals (`signalled`) while it
        waits (see step_deadline): StepHungError naming `work` when it does not finish;
        Stopped saying `waiting` and `lost` when a signal came and it still waits."""
        if not self._step_timeout_s:
            return fn()
        try:
            return step_deadline.Call(
                fn, self._step_timeout_s * factor, signalled, name=work.lower().replace(" ", "-")
            )
        except step_deadline.StepTimeout as e:
            raise self._StepHung(work, e.timeout_s) from None
        except step_deadline.StoppedWhileWaiting as e:
            raise Stopped(
                f"Stopped by {e.signal_name} while {waiting} for the devices or workers of the "
                f"run; {lost} (latest checkpoint: {self._checkpointer.latest}); rerun the same "
                "command to resume"
            ) from None

    def _Guarded(self, run: Callable[[], StepResult], step: int) -> StepResult:
        """run(), with the runtime's errors of a lost peer as ClusterError."""
        try:
            return run()
        except _CLUSTER_ERRORS as e:
            raise ClusterError(
                f"Step {step} failed: {type(e).__name__}: {e.message.splitlines()[0]}. "
                "A worker of the run is gone or unreachable. The checkpoints are "
                f"intact (latest: {self._checkpointer.latest}); restart every worker with "
                "the same command to resume from it."
            ) from None

    def _LastGood(self) -> str:
        last = self._checkpointer.latest
        return f"checkpoint is {last}." if last else "state was never checkpointed."

    def _CheckFinite(self, step: int, result: StepResult) -> None:
        """Raises NonFiniteError, before anything of `step` is saved, if its loss, a
        gradient or (after the update) a weight is not finite. A step the task skipped
        (metric `skipped_step`, float16's loss scaling) may have non-finite gradients."""
        loss, finite = float(result.metrics.loss[0]), result.grads_finite
        names = [v.name for v in self._task.trainable_variables]
        # A loss-scaled (float16) step whose gradients overflowed applied nothing: the
        # task lowered its loss scale and said so; only the weights are checked then.
        skipped = float(result.metrics.get("skipped_step", (0.0,))[0]) > 0
        if not (math.isfinite(loss) and (finite.all() or skipped)):
            bad = [n for n, ok in zip(names, finite) if not bool(ok)]
            problem = (
                f"the loss is {loss} and {len(bad)} of {len(finite)} gradients are not finite"
                + (f"; the first is that of {bad[0]}" if bad else "")
            )
        elif not result.weights_finite.all():
            bad = [n for n, ok in zip(names, result.weights_finite) if not bool(ok)]
            problem = (
                f"the update made {len(bad)} of {len(names)} weights non-finite; the first "
                f"is {bad[0]} (learning rate {_Scalars(result.metrics).get('learning_rate')})"
            )
        else:
            return
        raise NonFiniteError(
            f"Step {step}: {problem}. Training stopped before saving anything of this step; "
            f"the last good {self._LastGood()} Lower train.learning_rate, set "
            "train.clip_gradient_norm_to_value, or check the input."
        )

    def _AtMinScale(self, scalars: dict[str, float]) -> bool:
        """Whether the loss scale cannot go lower (a run whose steps overflowed above it
        may still find a scale that works)."""
        if "loss_scale" not in scalars:
            return False
        # The scale is a float32 variable: compare in float32.
        return scalars["loss_scale"] <= np.float32(self._task.params.train.loss_scale.min_scale)

    def _NeverUpdated(self, first: int, last: int, scalars: dict[str, float]) -> None:
        """Raises NonFiniteError: every step of this run was skipped (float16's loss scale
        overflowed each time), so it must not end as a success; the final step is not
        saved."""
        ls = self._task.params.train.loss_scale
        scale = scalars.get("loss_scale", float("nan"))
        # Above its minimum the scale was still falling: more steps may have found one.
        fix = "Lower train.loss_scale.initial_scale and min_scale"
        if not self._AtMinScale(scalars):
            fix = f"Run more steps, or lower train.loss_scale.initial_scale (now at {scale:g})"
        raise NonFiniteError(
            f"Steps {first}..{last}: every step was skipped (float16 gradients overflowed at "
            f"the loss scale {scale:g}, train.loss_scale.min_scale={ls.min_scale:g}), so the "
            f"weights never changed; the last {self._LastGood()} {fix}, or train in bfloat16 "
            "or float32."
        )

    def _Save(self, step: int) -> None:
        """Writes ckpt-<step> (the chief), bounded as a first step is: writing reads every
        weight from its device, and a stopped worker would hold the write for ever."""
        if self._is_chief and self._saved_step != step:
            path = self._Between(
                lambda: self._checkpointer.Save(step),
                f"Writing checkpoint ckpt-{step}",
                FIRST_STEP_FACTOR,
            )
            logging.info("Saved %s", path)
        self._saved_step = step

    def _Between(self, fn: Callable, work: str, factor: float):
        """fn(), work between steps (a checkpoint write, an evaluation batch) that `work`
        names, bounded as _WithDeadline says. It gives up on a signal only if the signal
        came while it waited: one that came before (the checkpoint written to stop) is not
        one it waits on, and a second one still gives up at once (StopSignals)."""
        before = self._signals.received if self._signals else None
        return self._WithDeadline(
            fn,
            lambda: None if before or not self._signals else self._signals.received,
            work,
            factor,
            f"{work[:1].lower()}{work[1:]} waited",
            "the checkpoints are intact",
        )

    def _Stop(self, step: int, signal_name: str) -> None:
        """Saves step `step` and raises Stopped."""
        self._Save(step)
        name = signal_name or "another worker's signal"
        self._Record("stopped", f"stopped by {name} at step {step}")
        raise Stopped(
            f"Stopped by {name} at step {step}; saved ckpt-{step}; rerun the same command to resume"
        )

    def Train(self) -> dict[str, float]:
        """Trains from the latest checkpoint (or from scratch) to train.max_steps.

        Returns the last step's metrics (empty if there was nothing left to train). A
        rerun of a run that reached max_steps only evaluates, if that was not done.

        Raises:
          NonFiniteError, ClusterError, Stopped, checkpointer.CheckpointError,
          rundir.LogdirWriteError (see their docstrings).
        """
        start = self._Restore()
        if start >= self._max_steps:
            self._CompleteFinished(start)
            return {}
        self._Record("running")
        writer = _SummaryWriter(self._logdir, self._is_chief, self._input.params.batch_size)
        if self._params_text is not None:
            writer.WriteParams(start, self._params_text)
        bar = progress.Progress(
            self._max_steps, stream=sys.stderr, interval_s=self._intervals.progress_seconds
        )
        bar.Start(start)
        try:
            with StopSignals() as signals:
                self._signals, self._first_step = signals, start + 1
                return self._Loop(start, writer, bar, signals)
        except NonFiniteError as e:
            self._Record("failed", str(e))
            raise
        finally:
            self._profiler.Close()
            bar.Close()
            writer.Close()

    def _Loop(self, start: int, writer, bar: progress.Progress, signals: StopSignals) -> dict:
        iterator = self._Iterator(start)
        iv, scalars = self._intervals, {}
        applied = 0  # steps of this run that updated the weights
        batch_size = self._input.params.batch_size
        for step in range(start + 1, self._max_steps + 1):
            self._profiler.Before(step)
            if self._watch is not None:
                self._watch.Before(step)
            result = self._RunStep(iterator, step, signals.received is not None)
            if self._watch is not None:
                self._watch.After(step, step == self._max_steps)
            self._profiler.After(step, step == self._max_steps)
            self._CheckFinite(step, result)
            self._global_step.assign(step)
            if step == start + 1:
                writer.StartRates(step)
            scalars = _Scalars(result.metrics)
            applied += scalars.get("skipped_step", 0.0) == 0.0
            bar.Update(step, scalars["loss"], examples_per_step=batch_size)
            last = step == self._max_steps
            if last and not applied:
                bar.Close()
                self._NeverUpdated(start + 1, step, scalars)
            if iv.summary_steps and step % iv.summary_steps == 0 or last:
                writer.Write(step, scalars)
            if iv.log_steps and step % iv.log_steps == 0:
                bar.Close()  # Log lines start on their own line, not after the bar.
                metrics = " ".join(f"{k}={v:.6g}" for k, v in scalars.items())
                rate = bar.RateText(step, batch_size)
                logging.info("step %d/%d %s  %s", step, self._max_steps, metrics, rate)
            if iv.checkpoint_steps and step % iv.checkpoint_steps == 0 or last:
                bar.Close()
                self._Save(step)
            # With several workers all must stop after the same step: the one agreed
            # in the step's all-reduce.
            if result.stop or (signals.received and not self._multi_worker):
                bar.Close()
                self._Stop(step, signals.received)
            if last:
                self._Record("trained")
            if self._evaluate and (iv.eval_steps and step % iv.eval_steps == 0 or last):
                bar.Close()
                self._Evaluate(step, "trained" if last else "running")
        return scalars


class _SummaryWriter:
    """The training summaries (chief only): metrics and rates, which count from the end of
    the first step (its tracing would make the first rate meaningless)."""

    def __init__(self, logdir: str, is_chief: bool, batch_size: int) -> None:
        self._writer = (
            tf.summary.create_file_writer(os.path.join(logdir, "train"))
            if is_chief
            else tf.summary.create_noop_writer()
        )
        self._batch_size = batch_size
        self._last: tuple[int, float] | None = None

    def StartRates(self, step: int) -> None:
        """Rates count from now, the end of step `step` (the run's first)."""
        self._last = (step, time.monotonic())

    def WriteParams(self, step: int, text: str) -> None:
        """The params as the text summary `params` (indented: Markdown shows it as is)."""
        with self._writer.as_default(step=step):
            tf.summary.text("params", "\n".join("    " + line for line in text.splitlines()))
        self._writer.flush()

    def Write(self, step: int, scalars: dict[str, float]) -> None:
        now = time.monotonic()
        with self._writer.as_default(step=step):
            for name, value in scalars.items():
                tf.summary.scalar(name, value)
            if self._last is not None and step > self._last[0]:
                rate = (step - self._last[0]) / max(now - self._last[1], 1e-9)
                tf.summary.scalar("steps_per_sec", rate)
                tf.summary.scalar("examples_per_sec", rate * self._batch_size)
        self._writer.flush()
        self._last = (step, now)

    def Close(self) -> None:
        self._writer.close()
