"""Mixed precision: bfloat16 compute on float32 master weights, equal to the sequential
reference in bfloat16; float16 with a loss scale that overflows skips the step."""

import numpy as np
import pytest
import tensorflow as tf
from gpipe_cells import DIMS, Pipeline, Transformer

from lingpipe import loss_scale
from lingpipe.nested_map import NestedMap


def Loss(outputs, unused_loss_inputs=None):
    x = tf.cast(outputs[0], tf.float32)
    rows = tf.cast(tf.shape(x)[0], tf.float32)
    return NestedMap(loss=(tf.reduce_mean(tf.square(x) + x), rows))


def _CrossStageTensors(graph):
    """(producer device, consumer device, tensor) of every tensor that crosses devices."""
    found = []
    for op in graph.get_operations():
        for t in op.inputs:
            a, b = t.op.device, op.device
            if a and b and a != b:
                found.append((a, b, t))
    return found


@pytest.mark.grappler
def test_bfloat16_pipeline_equals_the_sequential_reference_in_bfloat16():
    cells = [Transformer() for _ in range(4)]
    pipe = Pipeline(cells, 2, 4, remat="except_last", schedule="1f1b", fprop_dtype=tf.bfloat16)
    x = tf.cast(tf.random.stateless_normal([8, 4, DIMS], seed=[5, 6]), tf.bfloat16)
    args = (x, tf.zeros([8, 4], tf.bfloat16))
    variables = pipe.trainable_variables

    def Step():
        r = pipe.ForwardBackward(pipe.theta, args, Loss)
        by_ref = {
            v.ref(): g for v, g in zip(tf.nest.flatten(pipe.theta), tf.nest.flatten(r.theta_grads))
        }
        return r.metrics.loss[0], [by_ref[v.ref()] for v in variables]

    fn = tf.function(Step, autograph=False)
    loss, grads = fn()
    with tf.GradientTape() as tape:
        want_loss = Loss(pipe.FPropSequential(pipe.theta, *args)).loss[0]
    want_grads = tape.gradient(want_loss, variables)

    assert all(v.dtype == tf.float32 for v in variables)  # the master weights
    assert all(g.dtype == tf.float32 for g in grads)  # summed in float32
    np.testing.assert_allclose(loss, want_loss, rtol=1e-2)
    scale = max(float(np.max(np.abs(g))) for g in want_grads)
    for i, (g, w) in enumerate(zip(grads, want_grads)):
        np.testing.assert_allclose(g, w, rtol=2e-2, atol=2e-2 * scale, err_msg=f"gradient {i}")
    # Activations forward and their gradients backward cross stages in bfloat16
    # (scalars aside: the loss weights and the final 1 / total).
    crossing = _CrossStageTensors(fn.get_concrete_function().graph)
    floats = [t for _, _, t in crossing if t.dtype.is_floating and t.shape.rank != 0]
    assert floats and {t.dtype for t in floats} == {tf.bfloat16}, [
        (t.name, t.dtype.name) for t in floats if t.dtype != tf.bfloat16
    ]


def test_dynamic_loss_scale_lowers_at_once_and_grows_after_good_steps():
    scale = (
        loss_scale.DynamicLossScale.Params().Set(initial_scale=8.0, growth_interval=2).Instantiate()
    )
    grads = [tf.constant([1.0, np.inf]), None]
    assert not bool(loss_scale.AllFinite(grads))
    history = [float(scale.Update(ok)) for ok in (False, True, True, True, False, False, False)]
    assert history == [4.0, 4.0, 8.0, 8.0, 4.0, 2.0, 1.0]
    assert float(scale.Update(False)) == 1.0  # min_scale
