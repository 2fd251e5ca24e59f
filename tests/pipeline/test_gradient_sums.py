"""gradient_sums: an embedding's slices summed over micro-batches as the plain model's
lookup gives them: concatenated when the micro-batch chose the rows, added position by
position when every micro-batch looks up the same rows (read from the traced graph)."""

import numpy as np
import tensorflow as tf

from lingpipe.pipeline.step import gradient_sums


def _LookupGradients(position_lookup: bool):
    """Two micro-batches' gradients of a lookup in a [5, 2] table, in a traced graph."""
    table = tf.Variable(tf.reshape(tf.range(10, dtype=tf.float32), [5, 2]))

    @tf.function(autograph=False)
    def Sums(ids_a, ids_b):
        terms = []
        for ids in (ids_a, ids_b):
            rows = tf.range(tf.shape(ids)[1]) if position_lookup else ids
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.gather(table, rows) * tf.cast(tf.size(ids), tf.float32))
            terms.append(gradient_sums.Summand(tape.gradient(loss, table), True, [ids]))
        total = gradient_sums.Add(gradient_sums.Add(None, terms[0]), terms[1])
        return gradient_sums.Finished(total), [t.shared for t in terms]

    return Sums


def test_rows_chosen_by_the_micro_batch_are_concatenated():
    total, _ = _LookupGradients(False)(tf.constant([[0, 3]]), tf.constant([[3, 4]]))
    assert isinstance(total, tf.IndexedSlices)
    np.testing.assert_array_equal(total.indices.numpy(), [0, 3, 3, 4])
    np.testing.assert_array_equal(total.values.numpy(), np.full([4, 2], 2.0))


def test_rows_every_micro_batch_looks_up_are_added_position_by_position():
    # Positions 0..T-1 depend on the ids' shape only: one slice per position, summed.
    total, _ = _LookupGradients(True)(tf.constant([[0, 3]]), tf.constant([[3, 4]]))
    np.testing.assert_array_equal(total.indices.numpy(), [0, 1])
    np.testing.assert_array_equal(total.values.numpy(), np.full([2, 2], 4.0))


def test_a_dense_term_makes_the_sum_dense():
    slices = gradient_sums.Slices(tf.IndexedSlices(tf.ones([1, 2]), [1], [3, 2]), False)
    total = gradient_sums.Add(slices, tf.ones([3, 2]))
    np.testing.assert_array_equal(total.numpy(), [[1, 1], [2, 2], [1, 1]])
