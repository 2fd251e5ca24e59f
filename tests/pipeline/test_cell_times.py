"""cell_times.Profile: per cell F, I and W lines, an embedding's weight gradient made
dense as the executor's sum makes it."""

import tensorflow as tf

from lingpipe.layers import embedding, gpipe, linear
from lingpipe.pipeline.planning import cell_times


def test_an_embedding_s_gradient_is_timed_dense_as_the_executor_sums_it():
    slices = tf.IndexedSlices(tf.ones([2, 3]), tf.constant([0, 4]), tf.constant([5, 3]))
    dense, plain = cell_times.Dense([slices, tf.ones([3])])
    assert not isinstance(dense, tf.IndexedSlices)
    assert dense.numpy().tolist() == [[1.0] * 3, [0.0] * 3, [0.0] * 3, [0.0] * 3, [1.0] * 3]
    assert plain.numpy().tolist() == [1.0] * 3


def test_the_profile_has_a_line_per_cell_and_kind():
    cells = [
        embedding.EmbeddingLayer.Params().Set(name="emb", vocab_size=64, embedding_dim=8),
        linear.ProjectionLayer.Params().Set(name="proj", input_dims=8, output_dims=8),
    ]
    parent = gpipe.PipeliningLayer.Params().Set(name="pipe", cell_tpl=cells)
    specs = (tf.TensorSpec([16, 4], tf.int32),)
    times = cell_times.Profile(parent, cells, specs, sizes=(2, 8), repeats=2)
    assert times.source == "profile"
    for lines in (times.forward, times.backward_input, times.backward_weight):
        assert len(lines) == 2 and all(a >= 0 and b >= 0 for a, b in lines)
