"""Seq2SeqInput: a generated sequence-to-sequence task with a real learning signal.

A source is min_len..max_len symbols drawn uniformly from 3..vocab_size-1; the
target is the source reversed (`task='reverse'`) or sorted (`task='sort'`). Ids:
0 pads, 1 begins the target (BOS), 2 ends it (EOS).

Example `index` of a split is drawn by stateless random ops from a seed made of the
split and the index alone, so it is the same in every run and every sharding. The
training examples use (`seed`, 0); 'dev' and 'test' use the fixed seeds (0, 1) and
(0, 2), so evaluation data does not move with `seed` and differs from training.

Batch, with S = max_len and T = max_len + 1:

    src.ids       [b, S] int32    the source, then 0s
    src.paddings  [b, S] float32  1.0 past the source
    tgt.ids       [b, T] int32    BOS, target, then 0s
    tgt.labels    [b, T] int32    target, EOS, then 0s
    tgt.paddings  [b, T] float32  1.0 past EOS
    tgt.weights   [b, T] float32  1 - tgt.paddings
"""

from __future__ import annotations

import tensorflow as tf

from lingpipe import asserts, hyperparams
from lingpipe.inputs import base_input
from lingpipe.nested_map import NestedMap

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "FIRST_SYMBOL",
    "PAD_ID",
    "Seq2SeqInput",
    "TASKS",
]

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
FIRST_SYMBOL = 3

TASKS = ("reverse", "sort")
# Second half of each split's example seed; the first half is `seed` for 'train'
# and 0 for 'dev' and 'test'.
_SPLIT_SEEDS = {"train": 0, "dev": 1, "test": 2}


class Seq2SeqInput(base_input.BaseInputGenerator):
    """Generated reverse / sort examples (see the module docstring)."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("task", "reverse", "What the target is: 'reverse' or 'sort' of the source.")
        p.Define(
            "vocab_size",
            16,
            "Number of ids: 0 pad, 1 BOS, 2 EOS, and symbols 3..vocab_size-1.",
        )
        p.Define("min_len", 1, "Shortest source, in symbols.")
        p.Define("max_len", 8, "Longest source, in symbols; sources are padded to it.")
        p.Define("num_train_examples", 100_000, "Number of distinct 'train' examples.")
        p.Define("num_eval_examples", 1000, "Number of examples of 'dev' and of 'test'.")
        return p

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        asserts.In(p.task, TASKS, "task", where=self.where)
        asserts.Positive(p.min_len, "min_len", where=self.where)
        asserts.Positive(p.max_len, "max_len", where=self.where)
        asserts.Le(p.min_len, p.max_len, "min_len", "max_len", where=self.where)
        asserts.Positive(p.vocab_size, "vocab_size", where=self.where)
        asserts.Gt(
            p.vocab_size,
            FIRST_SYMBOL,
            "vocab_size",
            where=self.where,
            hint="ids 0, 1 and 2 are pad, BOS and EOS; symbols start at 3",
        )
        asserts.Positive(p.num_train_examples, "num_train_examples", where=self.where)
        asserts.Positive(p.num_eval_examples, "num_eval_examples", where=self.where)

    @property
    def src_len(self) -> int:
        """S: the padded source length, max_len."""
        return self.params.max_len

    @property
    def tgt_len(self) -> int:
        """T: the padded target length, max_len + 1 (room for BOS / EOS)."""
        return self.params.max_len + 1

    def NumExamples(self, split: str | None = None) -> int:
        p = self.params
        return p.num_train_examples if self._CheckSplit(split) == "train" else p.num_eval_examples

    def _Example(self, index: tf.Tensor) -> NestedMap:
        p = self.params
        first = p.seed if p.split == "train" else 0
        seed = tf.random.experimental.stateless_fold_in(
            tf.constant([first, _SPLIT_SEEDS[p.split]], tf.int64), index
        )
        len_seed, symbol_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        length = tf.random.stateless_uniform(
            [], len_seed, minval=p.min_len, maxval=p.max_len + 1, dtype=tf.int32
        )
        symbols = tf.random.stateless_uniform(
            [p.max_len], symbol_seed, minval=FIRST_SYMBOL, maxval=p.vocab_size, dtype=tf.int32
        )
        in_source = tf.range(p.max_len) < length
        source = tf.where(in_source, symbols, PAD_ID)
        if p.task == "reverse":
            target = tf.reverse_sequence(source[None], length[None], seq_axis=1, batch_axis=0)[0]
        else:
            # Pads sort last as vocab_size, then go back to 0.
            target = tf.sort(tf.where(in_source, symbols, p.vocab_size))
            target = tf.where(in_source, target, PAD_ID)
        src_paddings = 1.0 - tf.cast(in_source, tf.float32)
        positions = tf.range(p.max_len + 1)
        labels = tf.concat([target, [PAD_ID]], axis=0)
        labels = tf.where(tf.equal(positions, length), EOS_ID, labels)
        tgt_paddings = tf.cast(positions > length, tf.float32)
        return NestedMap(
            src=NestedMap(ids=source, paddings=src_paddings),
            tgt=NestedMap(
                ids=tf.concat([[BOS_ID], target], axis=0),
                labels=labels,
                paddings=tgt_paddings,
                weights=1.0 - tgt_paddings,
            ),
        )
