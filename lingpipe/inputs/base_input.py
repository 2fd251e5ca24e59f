"""BaseInputGenerator: a deterministic, shardable tf.data pipeline of NestedMap batches.

An input is a list of examples, numbered 0..NumExamples(split)-1, and a function
(`_Example(index)`) that builds example `index` of the chosen split. The base
class turns that into batches:

    p = text_lm.TextLmInput.Params().Set(batch_size=32)
    ds = p.Instantiate().GetDataset()            # NestedMap batches, static shapes
    ds = strategy.distribute_datasets_from_function(inp.GetDataset)

* Sharding: with a `tf.distribute.InputContext`, input pipeline k of n takes the
  examples whose index is k modulo n (the shards are disjoint), and batches them
  by the per-replica batch size: `batch_size` is always the global batch.
* Order: the 'train' split is shuffled, each epoch by its own stateless
  permutation seeded by (`seed`, epoch), so the same `seed` gives the same batches
  whatever the global TensorFlow seed is. 'dev' and 'test' keep index order.
* Shapes: batches use drop_remainder=True, so every batch has a static shape; an
  evaluation over a split without repeat sees floor(examples / batch) batches.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator

import numpy as np
import tensorflow as tf

from lingpipe import asserts, hyperparams
from lingpipe.nested_map import NestedMap

__all__ = [
    "BaseInputGenerator",
    "SPLITS",
]

SPLITS = ("train", "dev", "test")


class BaseInputGenerator(abc.ABC):
    """The base of every lingpipe input (see the module docstring).

    Subclasses define `NumExamples(split)` and `_Example(index)`, and may check
    their own params in `__init__` after calling the base's.
    """

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        """The params of this input class, with their defaults."""
        p = hyperparams.InstantiableParams(cls)
        p.Define("name", "input", "Name of this input; it leads error messages.")
        p.Define(
            "batch_size",
            8,
            "Global batch size, over all replicas; each replica gets batch_size / "
            "num_replicas_in_sync examples.",
        )
        p.Define("seed", 0, "Seed of the training order (and of generated training data).")
        p.Define("split", "train", "Which part of the data to read: 'train', 'dev' or 'test'.")
        p.Define(
            "repeat",
            None,
            "Whether to loop over the data forever; None means True for 'train' and "
            "False for 'dev' and 'test'.",
        )
        return p

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        hyperparams.CheckInstantiable(params, self)
        self._params = params.Copy().Freeze()
        p = self._params
        where = f"{type(self).__name__} {p.name!r}"
        asserts.Positive(p.batch_size, "batch_size", where=where)
        asserts.In(p.split, SPLITS, "split", where=where)
        if isinstance(p.seed, bool) or not isinstance(p.seed, int) or p.seed < 0:
            raise ValueError(
                f"{where}: expected seed to be a non-negative integer, received seed={p.seed!r}"
            )
        asserts.In(p.repeat, (None, True, False), "repeat", where=where)

    @property
    def params(self) -> hyperparams.InstantiableParams:
        """The (frozen) params this input was built from."""
        return self._params

    @property
    def where(self) -> str:
        """How error messages name this input: its class and name."""
        return f"{type(self).__name__} {self._params.name!r}"

    @property
    def repeat(self) -> bool:
        """Whether the dataset loops forever (`repeat`, or True for 'train' if None)."""
        p = self._params
        return p.split == "train" if p.repeat is None else p.repeat

    @property
    def shuffle(self) -> bool:
        """Whether examples come in a seeded random order: only for 'train'."""
        return self._params.split == "train"

    @abc.abstractmethod
    def NumExamples(self, split: str | None = None) -> int:
        """Number of examples in `split` (default: this input's split)."""

    @abc.abstractmethod
    def _Example(self, index: tf.Tensor) -> NestedMap:
        """Example `index` (a scalar int64 tensor) of this input's split, static shapes."""

    def _CheckSplit(self, split: str | None) -> str:
        """`split`, or this input's split when None; raises ValueError for unknown ones."""
        split = self._params.split if split is None else split
        asserts.In(split, SPLITS, "split", where=self.where)
        return split

    def PerReplicaBatchSize(self, input_context: tf.distribute.InputContext | None = None) -> int:
        """The batch size one replica sees: batch_size / num_replicas_in_sync.

        Raises:
          ValueError: batch_size is not divisible by the number of replicas.
        """
        p = self._params
        if input_context is None:
            return p.batch_size
        asserts.DivisibleBy(
            p.batch_size,
            input_context.num_replicas_in_sync,
            "global batch_size",
            "num_replicas_in_sync",
            where=self.where,
            hint="set batch_size to a multiple of the number of replicas",
        )
        return input_context.get_per_replica_batch_size(p.batch_size)

    def _ShardIndices(self, input_context: tf.distribute.InputContext | None) -> np.ndarray:
        """The example indices of this input pipeline: k, k + n, k + 2n, ..."""
        num_pipelines, pipeline_id = 1, 0
        if input_context is not None:
            num_pipelines = input_context.num_input_pipelines
            pipeline_id = input_context.input_pipeline_id
        return np.arange(pipeline_id, self.NumExamples(), num_pipelines, dtype=np.int64)

    def GetDataset(
        self, input_context: tf.distribute.InputContext | None = None, start_batch: int = 0
    ) -> tf.data.Dataset:
        """A dataset of NestedMap batches of per-replica batch size, with static shapes.

        Args:
          input_context: from `strategy.distribute_datasets_from_function`; None
            reads all the data as one pipeline with the global batch.
          start_batch: skip this many batches first, so that a resumed run reads
            on from where it stopped. Only example indices are skipped: no skipped
            example is built.

        Raises:
          ValueError: the batch is not divisible by the replicas, or this pipeline's
            share of the split is smaller than one batch.
        """
        p = self._params
        batch = self.PerReplicaBatchSize(input_context)
        indices = self._ShardIndices(input_context)
        if len(indices) < batch:
            raise ValueError(
                f"{self.where}: split {p.split!r} gives this input pipeline {len(indices)} "
                f"examples, fewer than one batch of {batch}; every batch is full "
                "(drop_remainder), so this would yield nothing. Use a smaller batch_size "
                "or more data."
            )
        if isinstance(start_batch, bool) or not isinstance(start_batch, int) or start_batch < 0:
            raise ValueError(
                f"{self.where}: expected start_batch to be an integer >= 0, received "
                f"start_batch={start_batch!r}"
            )
        indices_t = tf.constant(indices)
        if self.shuffle:
            epochs = tf.data.Dataset.counter() if self.repeat else tf.data.Dataset.range(1)
            seed = tf.constant(p.seed, tf.int64)

            def _Epoch(epoch: tf.Tensor) -> tf.data.Dataset:
                keys = tf.random.stateless_uniform([len(indices)], seed=tf.stack([seed, epoch]))
                return tf.data.Dataset.from_tensor_slices(tf.gather(indices_t, tf.argsort(keys)))

            dataset = epochs.flat_map(_Epoch)
        else:
            dataset = tf.data.Dataset.from_tensor_slices(indices_t)
            if self.repeat:
                dataset = dataset.repeat()
        dataset = dataset.skip(start_batch * batch)
        dataset = dataset.map(
            self._Example, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
        )
        dataset = dataset.batch(batch, drop_remainder=True)
        # No autotuning thread: deleting an iterator waits for it to wake from its
        # optimization period (doubling up to 60 s), which it does not cut short, so
        # the trainer hung 15-40 s after its last evaluation (seen with gdb in TF 2.21).
        options = tf.data.Options()
        options.autotune.enabled = False
        return dataset.prefetch(tf.data.AUTOTUNE).with_options(options)

    def Batches(self, num_batches: int | None = None) -> Iterator[NestedMap]:
        """Yields the first `num_batches` batches (all of them if None) as numpy NestedMaps.

        Raises:
          ValueError: num_batches is None and the input repeats forever, or the split
            has fewer batches than asked for.
        """
        p = self._params
        if num_batches is None and self.repeat:
            raise ValueError(
                f"{self.where}: Batches(None) asks for every batch, but split {p.split!r} "
                "repeats forever; pass a number of batches or set repeat=False"
            )
        if num_batches is not None:
            asserts.Positive(num_batches, "num_batches", where=self.where)
        dataset = self.GetDataset()
        if num_batches is not None:
            dataset = dataset.take(num_batches)
        count = 0
        for batch in dataset:
            count += 1
            yield tf.nest.map_structure(lambda t: t.numpy(), batch)
        if num_batches is not None and count < num_batches:
            raise ValueError(
                f"{self.where}: split {p.split!r} has only {count} batches of "
                f"{p.batch_size}, asked for {num_batches}"
            )
