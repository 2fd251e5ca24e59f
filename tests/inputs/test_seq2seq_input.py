"""Seq2SeqInput, and the BaseInputGenerator contract it shares: determinism, sharding, errors."""

import numpy as np
import pytest
import tensorflow as tf

from lingpipe import hyperparams
from lingpipe.inputs import base_input, seq2seq


def _Input(**kwargs):
    return seq2seq.Seq2SeqInput.Params().Set(**kwargs).Instantiate()


def _Context(pipeline_id, num_pipelines=2, num_replicas=2):
    return tf.distribute.InputContext(num_pipelines, pipeline_id, num_replicas)


def _Examples(batches):
    """Rows of a list of batches, as (src ids, tgt labels) tuples."""
    return [
        (tuple(src), tuple(tgt))
        for b in batches
        for src, tgt in zip(b.src.ids.tolist(), b.tgt.labels.tolist())
    ]


def _CheckTargets(batch, task, min_len, max_len, vocab_size):
    """Every row against a numpy reference of the task."""
    for row in range(batch.src.ids.shape[0]):
        src_ids, src_pad = batch.src.ids[row], batch.src.paddings[row]
        length = int((src_pad == 0).sum())
        assert min_len <= length <= max_len
        source = src_ids[:length]
        np.testing.assert_array_equal(src_pad, [0.0] * length + [1.0] * (max_len - length))
        np.testing.assert_array_equal(src_ids[length:], 0)
        assert source.min() >= seq2seq.FIRST_SYMBOL and source.max() < vocab_size
        target = source[::-1] if task == "reverse" else np.sort(source)
        pad = [0] * (max_len - length)
        np.testing.assert_array_equal(batch.tgt.ids[row], [seq2seq.BOS_ID, *target, *pad])
        np.testing.assert_array_equal(batch.tgt.labels[row], [*target, seq2seq.EOS_ID, *pad])
        expected_pad = [0.0] * (length + 1) + [1.0] * (max_len - length)
        np.testing.assert_array_equal(batch.tgt.paddings[row], expected_pad)
        np.testing.assert_array_equal(batch.tgt.weights[row], 1.0 - np.array(expected_pad))


@pytest.mark.parametrize("task", ["reverse", "sort"])
def test_targets_are_the_task_for_every_example(task):
    for split in ("train", "test"):
        inp = _Input(task=task, batch_size=64, min_len=2, max_len=7, vocab_size=12, split=split)
        (batch,) = inp.Batches(1)
        _CheckTargets(batch, task, min_len=2, max_len=7, vocab_size=12)
        lengths = (batch.src.paddings == 0).sum(axis=1)
        assert lengths.min() == 2 and lengths.max() == 7  # Both ends of the range occur.


def test_static_shapes_and_dtypes():
    inp = _Input(batch_size=4, max_len=6)
    spec = inp.GetDataset().element_spec
    assert spec.src.ids.shape == [4, 6] and spec.src.ids.dtype == tf.int32
    assert spec.src.paddings.shape == [4, 6] and spec.src.paddings.dtype == tf.float32
    for key in ("ids", "labels"):
        assert spec.tgt[key].shape == [4, 7] and spec.tgt[key].dtype == tf.int32
    for key in ("paddings", "weights"):
        assert spec.tgt[key].shape == [4, 7] and spec.tgt[key].dtype == tf.float32
    assert (inp.src_len, inp.tgt_len) == (6, 7)


def test_same_seed_same_batches_whatever_the_global_seed():
    tf.random.set_seed(1)
    first = list(_Input(seed=5).Batches(3))
    tf.random.set_seed(2)
    again = list(_Input(seed=5).Batches(3))
    other = list(_Input(seed=6).Batches(3))
    tf.nest.map_structure(np.testing.assert_array_equal, first, again)
    assert _Examples(first) != _Examples(other)


def test_eval_data_is_fixed_and_differs_from_train():
    dev = _Examples(_Input(split="dev", seed=1, batch_size=256, min_len=5).Batches(1))
    assert dev == _Examples(_Input(split="dev", seed=2, batch_size=256, min_len=5).Batches(1))
    test = _Examples(_Input(split="test", batch_size=256, min_len=5).Batches(1))
    train = _Examples(_Input(split="train", batch_size=256, min_len=5).Batches(1))
    # 13**5 or more sources: a few shared ones would be chance, not the same stream.
    assert len(set(dev) & set(train)) < 5 and len(set(dev) & set(test)) < 5


def test_train_epoch_is_a_permutation_and_repeats_in_a_new_order():
    # Sources of 8 symbols out of 13: the 40 examples are distinct.
    kwargs = dict(num_train_examples=40, batch_size=8, min_len=8, max_len=8)
    epoch = _Examples(_Input(repeat=False, **kwargs).Batches())
    assert len(epoch) == len(set(epoch)) == 40
    looped = _Examples(_Input(**kwargs).Batches(10))
    assert looped[:40] == epoch
    assert sorted(looped[40:]) == sorted(epoch) and looped[40:] != epoch


def test_sharding_two_pipelines_is_disjoint_per_replica_batches():
    # 'dev' keeps index order: pipeline k reads examples k, k + 2, k + 4, ...
    inp = _Input(split="dev", batch_size=8, num_eval_examples=32)
    whole = _Examples(inp.Batches())
    shards = []
    for k in range(2):
        batches = list(inp.GetDataset(_Context(k)))
        assert [b.src.ids.shape[0] for b in batches] == [4] * 4  # Per-replica batch.
        shards.append(_Examples([tf.nest.map_structure(np.asarray, b) for b in batches]))
    assert shards[0] == whole[0::2] and shards[1] == whole[1::2]
    # Shuffled 'train': the shards still split one epoch without overlap.
    inp = _Input(batch_size=8, num_train_examples=32, repeat=False)
    train = [
        _Examples([tf.nest.map_structure(np.asarray, b) for b in inp.GetDataset(_Context(k))])
        for k in range(2)
    ]
    assert not set(train[0]) & set(train[1])
    assert sorted(train[0] + train[1]) == sorted(_Examples(inp.Batches()))


def test_distribute_datasets_from_function_over_two_devices():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    inp = _Input(batch_size=6, split="dev")
    dist = strategy.distribute_datasets_from_function(inp.GetDataset)
    batch = next(iter(dist))
    per_replica = strategy.experimental_local_results(batch.src.ids)
    assert [r.shape.as_list() for r in per_replica] == [[3, 8], [3, 8]]


def test_batch_not_divisible_by_replicas_names_both():
    inp = _Input(batch_size=6)
    with pytest.raises(
        ValueError,
        match=r"global batch_size to be divisible by "
        r"num_replicas_in_sync, received global batch_size=6, "
        r"num_replicas_in_sync=4",
    ):
        inp.GetDataset(_Context(0, num_pipelines=1, num_replicas=4))


def test_batches_errors():
    inp = _Input(split="dev", batch_size=8, num_eval_examples=20)
    assert len(list(inp.Batches())) == 2  # 20 // 8: the remainder is dropped.
    with pytest.raises(ValueError, match=r"split 'dev' has only 2 batches of 8, asked for 3"):
        list(inp.Batches(3))
    with pytest.raises(
        ValueError,
        match=r"Batches\(None\) asks for every batch, but split "
        r"'train' repeats forever",
    ):
        list(_Input().Batches())
    with pytest.raises(
        ValueError,
        match=r"expected num_batches to be a positive integer, "
        r"received num_batches=0",
    ):
        list(inp.Batches(0))
    with pytest.raises(
        ValueError,
        match=r"split 'dev' gives this input pipeline 10 examples, "
        r"fewer than one batch of 16",
    ):
        _Input(split="dev", batch_size=32, num_eval_examples=20).GetDataset(_Context(1))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(batch_size=0),
            r"expected batch_size to be a positive integer, received "
            r"batch_size=0",
        ),
        (
            dict(split="eval"),
            r"expected split to be one of \['train', 'dev', 'test'\], "
            r"received split='eval'",
        ),
        (dict(seed=-1), r"expected seed to be a non-negative integer, received seed=-1"),
        (dict(repeat="yes"), r"expected repeat to be one of \[None, True, False\]"),
        (
            dict(task="copy"),
            r"expected task to be one of \['reverse', 'sort'\], received "
            r"task='copy'",
        ),
        (
            dict(min_len=5, max_len=4),
            r"expected min_len <= max_len, received min_len=5, "
            r"max_len=4",
        ),
        (
            dict(vocab_size=3),
            r"expected vocab_size > 3, received vocab_size=3; ids 0, 1 and "
            r"2 are pad, BOS and EOS",
        ),
        (dict(num_eval_examples=0), r"expected num_eval_examples to be a positive integer"),
    ],
)
def test_params_errors(kwargs, message):
    with pytest.raises(ValueError, match=r"Seq2SeqInput 'input': " + message):
        _Input(**kwargs)


def test_other_errors():
    with pytest.raises(
        TypeError,
        match=r"Seq2SeqInput: expected InstantiableParams .*"
        r"received Params",
    ):
        seq2seq.Seq2SeqInput(hyperparams.Params())
    with pytest.raises(
        ValueError,
        match=r"expected split to be one of .* received "
        r"split='valid'",
    ):
        _Input().NumExamples("valid")
    assert base_input.SPLITS == ("train", "dev", "test")
