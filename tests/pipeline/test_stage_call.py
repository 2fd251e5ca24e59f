"""StageCall and GradientAccumulator on their own."""

import numpy as np
import pytest
import tensorflow as tf
from gpipe_cells import Pipeline

from lingpipe.layers import linear
from lingpipe.pipeline.stage_call import GradientAccumulator, StageCall
from lingpipe.pipeline.stage_context import StageContext


def test_accumulator_returns_the_total_once_then_resets():
    acc = GradientAccumulator(3)
    assert acc.Add([tf.constant(1.0), None]) == [None, None]
    assert acc.Add([tf.constant(2.0), tf.constant(5.0)]) == [None, None]
    total = acc.Add([tf.constant(4.0), None])
    assert float(total[0]) == 7.0 and float(total[1]) == 5.0
    assert acc.Add([tf.constant(1.0)]) == [None]  # a new computation starts over


def test_stage_call_gradients_equal_plain_ones_eagerly_and_traced():
    w = tf.Variable([[1.0, 2.0], [3.0, -1.0]])
    x = tf.constant([[0.5, -2.0]])

    def Fn(theta, h):
        return tf.tanh(tf.matmul(h, theta)) * 2.0

    def Grads(recompute):
        with tf.GradientTape() as tape:
            y = StageCall(Fn, (w, x), StageContext(0, "/device:CPU:3", 0), recompute)
            loss = tf.reduce_sum(y**2)
        return tape.gradient(loss, w)

    with tf.GradientTape() as tape:
        want = tape.gradient(tf.reduce_sum(Fn(w, x) ** 2), w)
    for recompute in (True, False):
        np.testing.assert_allclose(Grads(recompute).numpy(), want.numpy(), rtol=1e-6)
        traced = tf.function(lambda r=recompute: Grads(r), autograph=False)()
        np.testing.assert_allclose(traced.numpy(), want.numpy(), rtol=1e-6)


def _StepBytes(pipe, x):
    @tf.function(autograph=False)
    def Step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(pipe(x))
        return tape.gradient(loss, pipe.trainable_variables)

    Step.get_concrete_function()
    Step()
    tf.config.experimental.reset_memory_stats("CPU:0")
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    Step()
    return tf.config.experimental.get_memory_info("CPU:0")["peak"] - before


@pytest.mark.parametrize("remat", ["always", "never"])
def test_weight_gradients_accumulate_without_keeping_one_per_micro_batch(remat):
    # Weights dominate (4 x 1 MiB, 64 rows): holding each micro-batch's weight gradient
    # until the end would need 8 x 4 MiB; a running sum needs about twice the weights.
    cell = linear.ProjectionLayer.Params().Set(input_dims=512, output_dims=512)
    pipe = Pipeline([cell] * 4, 1, 8, remat)
    weight_bytes = sum(v.shape.num_elements() * 4 for v in pipe.trainable_variables)
    step = _StepBytes(pipe, tf.ones([64, 512]))
    assert step < 3 * weight_bytes, (
        f"step {step / 2**20:.1f} MiB, weights {weight_bytes / 2**20:.1f}"
    )


def test_lookup_gradients_accumulate_over_micro_batches():
    # An embedding lookup's gradient is IndexedSlices; summing those across micro-batches
    # must work, and equal the sequential reference.
    from gpipe_cells import AssertSame, PipelineAndReference

    from lingpipe import base_layer
    from lingpipe.layers import embedding

    class LookupCell(base_layer.BaseLayer):
        @classmethod
        def Params(cls):
            p = super().Params()
            p.Define(
                "emb",
                embedding.EmbeddingLayer.Params().Set(vocab_size=11, embedding_dim=4),
                "The table.",
            )
            return p

        def __init__(self, params):
            super().__init__(params)
            self.CreateChild("emb", self.params.emb)

        def FProp(self, theta, ids):
            return self.emb.FProp(theta.emb, ids)

    tail = linear.ProjectionLayer.Params().Set(input_dims=4, output_dims=4)
    pipe = Pipeline([LookupCell.Params(), tail], 2, 4)
    ids = tf.constant([[1, 2], [3, 3], [4, 10], [0, 1], [5, 5], [2, 7], [9, 9], [1, 8]])
    AssertSame(*PipelineAndReference(pipe, (ids,)))
