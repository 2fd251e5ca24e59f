"""Evaluation of a task on one dataset: weighted metrics, summaries and a JSON file.

    evaler = Evaler([task], strategy, dev_input, 'Dev', logdir, model_key)
    metrics = evaler.Evaluate(step)     # {'loss': 2.31, 'log_pplx': ..., ...}

Each metric is averaged over the batches with its weight (the number of tokens or
examples it was computed on), so the result does not depend on how the data was
batched. At most `task.params.eval.samples_per_summary` examples are read (0: the
whole split), and never more than the split holds. The results go to the
summaries in logdir/eval_<dataset> and, as JSON, to logdir/eval_<dataset>.json
(through `tf.io.gfile`: any logdir TensorFlow can write). `Results(logdir)` reads
the latest of them back, for the trainer's closing line.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from collections.abc import Callable
from typing import Any

import tensorflow as tf
from absl import logging

from lingpipe.models import base_task
from lingpipe.runners import rundir, train_loop

__all__ = [
    "Bound",
    "Evaler",
    "Results",
]

# bound(fn, work, first) -> fn(): how Evaluate runs each batch (see there).
Bound = Callable[[Callable[[], Any], str, bool], Any]


class Evaler:
    """Evaluates the task on `input_generator`'s dataset (see the module docstring).

    `tasks` holds one copy of the task per local replica of `strategy`; only the
    chief writes summaries and JSON.
    """

    def __init__(
        self,
        tasks: list[base_task.BaseTask],
        strategy: tf.distribute.Strategy,
        input_generator,
        dataset: str,
        logdir: str,
        model_key: str,
        is_chief: bool = True,
        num_workers: int = 1,
        replica_context=None,
    ) -> None:
        self._is_chief = is_chief
        self._strategy = strategy
        self._input = input_generator
        self._dataset = dataset
        self._name = f"eval_{dataset.lower()}"
        self._logdir = logdir
        self._model_key = model_key
        self._writer = None
        batch = input_generator.params.batch_size
        wanted = tasks[0].params.eval.samples_per_summary
        # Each worker reads its shard, batch / num_workers examples per step.
        available = (input_generator.NumExamples() // num_workers) // (batch // num_workers)
        if not input_generator.repeat:
            self._num_batches = available if wanted <= 0 else min(available, -(-wanted // batch))
        elif wanted > 0:
            self._num_batches = -(-wanted // batch)
        else:
            raise ValueError(
                f"{dataset}: the input repeats forever and eval.samples_per_summary is "
                f"{wanted}; expected samples_per_summary > 0 to bound the evaluation"
            )

        def Step(iterator):
            batch = next(iterator)

            def Replica(b):
                task = train_loop.ReplicaTask(tasks, strategy)
                with replica_context() if replica_context else contextlib.nullcontext():
                    return train_loop.WeightedSums(task.EvalStep(b))

            out = strategy.run(Replica, args=(batch,))
            return {
                k: strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None) for k, v in out.items()
            }

        self._step = tf.function(Step, autograph=False)

    @property
    def dataset(self) -> str:
        return self._dataset

    @property
    def json_path(self) -> str:
        return os.path.join(self._logdir, self._name + ".json")

    @property
    def num_batches(self) -> int:
        return self._num_batches

    def _Batch(self, iterator) -> dict[str, list[float]]:
        """One batch's weighted sums, on the host: {metric: [value * weight, weight]}."""
        return {name: pair.numpy().tolist() for name, pair in self._step(iterator).items()}

    def Evaluate(self, step: int, bound: Bound | None = None) -> dict[str, float]:
        """Metrics of the task's current weights on the dataset, recorded as of `step`.

        `bound(fn, work, first)` runs each batch's `fn` (`work` names it, `first` is the
        first batch, which may trace): the train loop's deadline, as a batch reads every
        weight from its device and a stopped worker would hold it for ever. None: as is.
        """
        start = time.monotonic()
        # Repeated: a finite dataset makes multi-worker strategies hide the batch size
        # (to allow uneven ends); the evaluation takes its num_batches regardless.
        dataset = self._strategy.distribute_datasets_from_function(
            lambda ctx: self._input.GetDataset(ctx).repeat()
        )
        iterator = iter(dataset)
        totals: dict[str, list[float]] = {}
        bound = bound or (lambda fn, work, first: fn())
        for i in range(self._num_batches):
            work = f"Evaluating {self._dataset} batch {i + 1} of {self._num_batches} at step {step}"
            sums = bound(functools.partial(self._Batch, iterator), work, i == 0)
            for name, (v, w) in sums.items():
                acc = totals.setdefault(name, [0.0, 0.0])
                acc[0] += v
                acc[1] += w
        metrics = {k: (vw / w if w > 0 else float("nan")) for k, (vw, w) in sorted(totals.items())}
        examples = self._num_batches * self._input.params.batch_size
        if not self._is_chief:
            return metrics
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(os.path.join(self._logdir, self._name))
        with self._writer.as_default(step=step):
            for name, value in metrics.items():
                tf.summary.scalar(name, value)
        self._writer.flush()
        record = {
            "model": self._model_key,
            "dataset": self._dataset,
            "step": step,
            "examples": examples,
            "metrics": metrics,
        }
        rundir.WriteText(self.json_path, json.dumps(record, indent=2, sort_keys=True) + "\n")
        logging.info(
            "Eval %s at step %d over %d examples (%.1fs): %s",
            self._dataset,
            step,
            examples,
            time.monotonic() - start,
            " ".join(f"{k}={v:.6g}" for k, v in metrics.items()),
        )
        return metrics


def Results(logdir: str, datasets: list[str]) -> str:
    """The recorded evaluations of `datasets` in one line, e.g. 'Dev at step 40: loss=2.31
    log_pplx=2.31; Test at step 40: ...', or 'no evaluation' when none was recorded."""
    parts = []
    for dataset in datasets:
        path = os.path.join(logdir, f"eval_{dataset.lower()}.json")
        try:
            with tf.io.gfile.GFile(path) as f:
                record = json.loads(f.read())
            metrics = " ".join(f"{k}={v:.6g}" for k, v in sorted(record["metrics"].items()))
            parts.append(f"{dataset} at step {record['step']}: {metrics}")
        except (tf.errors.OpError, OSError, ValueError, KeyError, TypeError):
            continue
    return "; ".join(parts) if parts else "no evaluation"
