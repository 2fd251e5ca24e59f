"""micro_batch: uneven split, merge, unbatched leaves, errors."""

import numpy as np
import pytest
import tensorflow as tf

from lingpipe.nested_map import NestedMap
from lingpipe.pipeline.step import micro_batch


def test_sizes_are_as_even_as_possible_larger_first():
    assert micro_batch.Sizes(10, 4) == [3, 3, 2, 2]
    assert micro_batch.Sizes(8, 8) == [1] * 8
    assert micro_batch.Sizes(7, 1) == [7]


def test_sizes_errors():
    with pytest.raises(
        ValueError,
        match="pipe: expected 1 <= num_micro_batches <= batch size, "
        "received num_micro_batches=5, batch=4",
    ):
        micro_batch.Sizes(4, 5, "pipe")
    with pytest.raises(ValueError, match="num_micro_batches=0"):
        micro_batch.Sizes(4, 0)


def test_split_and_merge_round_trip_nested_map_with_unbatched_leaf():
    x = tf.reshape(tf.range(30.0), [10, 3])
    ids = tf.range(10)
    table = tf.ones([5])  # no batch dimension: goes whole to every micro-batch
    inputs = (NestedMap(x=x, ids=ids), table)
    sizes = micro_batch.Sizes(10, 4)
    parts = micro_batch.Split(inputs, sizes, 0)
    assert [int(p[0].x.shape[0]) for p in parts] == [3, 3, 2, 2]
    assert all(p[1] is table for p in parts)
    assert isinstance(parts[2][0], NestedMap)
    merged = micro_batch.Merge([p[0] for p in parts], sizes, 0)
    np.testing.assert_array_equal(merged.x.numpy(), x.numpy())
    np.testing.assert_array_equal(merged.ids.numpy(), ids.numpy())


def test_split_along_a_later_batch_dim():
    x = tf.reshape(tf.range(24.0), [2, 6, 2])
    sizes = micro_batch.Sizes(6, 3)
    parts = micro_batch.Split((x,), sizes, 1)
    assert parts[0][0].shape == (2, 2, 2)
    merged = micro_batch.Merge([p[0] for p in parts], sizes, 1)
    np.testing.assert_array_equal(merged.numpy(), x.numpy())


def test_merge_stacks_per_micro_batch_scalars():
    merged = micro_batch.Merge([tf.constant(1.0), tf.constant(2.0)], [3, 3], 0)
    np.testing.assert_array_equal(merged.numpy(), [1.0, 2.0])


def test_batch_size_is_the_size_most_leaves_share():
    # A shared table sorts first ("emb" < "ids") but must not decide the batch.
    state = NestedMap(emb=tf.ones([1, 7, 3]), ids=tf.ones([5, 2]), w=tf.ones([5, 2]))
    assert micro_batch.BatchSize(state, 0) == 5
    assert micro_batch.BatchSize((tf.ones([4, 2]), tf.ones([3])), 0) == 4  # tie: first


def test_batch_size_errors():
    assert micro_batch.BatchSize((tf.ones([]), tf.ones([6, 2])), 0) == 6
    with pytest.raises(ValueError, match="no input tensor has a dimension batch_dim=1"):
        micro_batch.BatchSize((tf.ones([3]),), 1, "pipe")


def test_unknown_batch_is_read_at_run_time_and_split_evenly():
    @tf.function(input_signature=[tf.TensorSpec([None, 4]), tf.TensorSpec([4])])
    def SplitMerge(x, per_model):
        batch = micro_batch.BatchSize((x, per_model), 0, "pipe")
        assert isinstance(batch, tf.Tensor)  # unknown at trace time
        sizes = micro_batch.Sizes(batch, 4, "pipe")
        parts = micro_batch.Split((x, per_model), sizes, 0)
        assert all(p[1] is per_model for p in parts)  # a static non-batch size stays whole
        merged = micro_batch.Merge([p[0] for p in parts], sizes, 0)
        grads = micro_batch.MergeGradients([[p[0], p[1]] for p in parts], (x, per_model), sizes, 0)
        return [tf.shape(p[0])[0] for p in parts], merged, grads[1]

    x = tf.reshape(tf.range(40.0), [10, 4])
    rows, merged, per_model_grad = SplitMerge(x, tf.ones([4]))
    assert [int(r) for r in rows] == [3, 3, 2, 2]
    np.testing.assert_array_equal(merged.numpy(), x.numpy())
    np.testing.assert_array_equal(per_model_grad.numpy(), [4.0] * 4)  # summed over 4
    rows, _, _ = SplitMerge(x[:7], tf.ones([4]))
    assert [int(r) for r in rows] == [2, 2, 2, 1]
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match="pipe: batch 3 is smaller than num_micro_batches=4; give batches of at least 4",
    ):
        SplitMerge(x[:3], tf.ones([4]))
