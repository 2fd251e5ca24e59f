"""The check every executor test makes: a pipeline's ForwardBackward, run by its
schedule, gives the loss, metrics and gradients of its sequential reference."""

import numpy as np
import tensorflow as tf

from lingpipe import test_utils
from lingpipe.nested_map import NestedMap


def Loss(outputs, unused_loss_inputs=None):
    x = outputs[0] if isinstance(outputs, tuple) else outputs
    x = x.x if isinstance(x, NestedMap) else x
    rows = tf.cast(tf.shape(x)[0], tf.float32)
    return NestedMap(loss=(tf.reduce_mean(tf.square(x) + x), rows), mean=(tf.reduce_mean(x), rows))


def Scheduled(pipe, args, use_function, variables):
    def Step():
        r = pipe.ForwardBackward(pipe.theta, args, Loss)
        by_ref = {
            v.ref(): g for v, g in zip(tf.nest.flatten(pipe.theta), tf.nest.flatten(r.theta_grads))
        }
        grads = [by_ref[v.ref()] for v in variables]
        return r.metrics, grads, r.input_grads

    return tf.function(Step, autograph=False)() if use_function else Step()


def Reference(pipe, args, variables, fprop=None):
    with tf.GradientTape() as tape:
        tape.watch(args)
        outputs = (fprop or pipe.FPropSequential)(pipe.theta, *args)
        metrics = Loss(outputs)
    grads = tape.gradient(metrics.loss[0], list(variables) + list(tf.nest.flatten(args)))
    n = len(variables)
    return metrics, grads[:n], tf.nest.pack_sequence_as(args, grads[n:])


def AssertSameAsReference(pipe, args, use_function=False, rtol=test_utils.RTOL, fprop=None):
    variables = list(pipe.trainable_variables)
    (metrics, grads, input_grads) = Scheduled(pipe, args, use_function, variables)
    want_metrics, want_grads, want_input_grads = Reference(pipe, args, variables, fprop)
    for name in ("loss", "mean"):
        np.testing.assert_allclose(metrics[name][0], want_metrics[name][0], rtol=rtol, atol=1e-6)
        np.testing.assert_allclose(metrics[name][1], want_metrics[name][1])
    assert all(g is not None for g in grads), "a variable got no gradient"
    scale = max(float(np.max(np.abs(g))) for g in want_grads)
    for i, (g, w) in enumerate(zip(grads, want_grads)):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * scale, err_msg=f"gradient {i}")
    for g, w in zip(tf.nest.flatten(input_grads), tf.nest.flatten(want_input_grads)):
        if w is None:  # an input the cells never read (a skip slot that is overwritten)
            assert g is None or not np.any(g)
        else:
            test_utils.AssertAllCloseToScale(g, w, rtol=rtol)
