"""jit_compile_stages: each stage's forward, recomputation and gradient compiled with
XLA on its own device, equal to the uncompiled pipeline within 1e-5."""

import numpy as np
import pytest
import tensorflow as tf
from gpipe_cells import DIMS, Mlp, MlpWithBatchNorm, Pipeline, Transformer

from lingpipe.nested_map import NestedMap


def CompiledFunctionCalls(graph: tf.Graph) -> list[tuple[str, str]]:
    """(device, function name) of each call of an XLA-compiled function in `graph`
    (forward and gradient functions alike)."""
    found = []
    for op in graph.get_operations():
        if op.type not in ("PartitionedCall", "StatefulPartitionedCall"):
            continue
        fn = op.get_attr("f").name
        definition = graph._get_function(fn)  # noqa: SLF001 (the only lookup TF offers)
        attrs = definition.cached_definition.attr if definition is not None else {}
        if "_XlaMustCompile" in attrs and attrs["_XlaMustCompile"].b:
            found.append((op.device, fn))
    return found


def Loss(outputs, unused_loss_inputs=None):
    x = outputs[0] if isinstance(outputs, tuple) else outputs
    rows = tf.cast(tf.shape(x)[0], tf.float32)
    return NestedMap(loss=(tf.reduce_mean(tf.square(x) + x), rows))


def Step(pipe, args):
    """(loss, gradients of the trainable variables, graph) of one traced ForwardBackward."""

    def Run():
        r = pipe.ForwardBackward(pipe.theta, args, Loss)
        by_ref = {
            v.ref(): g for v, g in zip(tf.nest.flatten(pipe.theta), tf.nest.flatten(r.theta_grads))
        }
        return r.metrics.loss[0], [by_ref[v.ref()] for v in pipe.trainable_variables]

    fn = tf.function(Run, autograph=False)
    loss, grads = fn()
    return loss, grads, fn.get_concrete_function().graph


@pytest.mark.parametrize(
    "cells,sched,remat", [("transformer", "1f1b", "except_last"), ("mlp", "zero_bubble", "never")]
)
def test_compiled_stages_equal_the_uncompiled_pipeline(cells, sched, remat):
    x = tf.random.stateless_normal([4, 4, DIMS], seed=[1, 2])
    args = (x, tf.zeros([4, 4])) if cells == "transformer" else (x,)
    # No dropout: XLA's stateless RNG draws other bits than TensorFlow's kernels.
    cells = [Transformer() if cells == "transformer" else Mlp() for _ in range(2)]
    plain = Pipeline(cells, 2, 2, remat=remat, schedule=sched)
    compiled = Pipeline(cells, 2, 2, remat=remat, schedule=sched, jit_compile_stages=True)
    for a, b in zip(compiled.trainable_variables, plain.trainable_variables):
        a.assign(b)
    want_loss, want_grads, _ = Step(plain, args)
    loss, grads, graph = Step(compiled, args)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    for i, (g, w) in enumerate(zip(grads, want_grads)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"gradient {i}")
    calls = CompiledFunctionCalls(graph)
    for k in range(2):
        on_k = [fn for device, fn in calls if device.endswith(f"CPU:{k}")]
        # Every forward (and replay) and every gradient of stage k is compiled, on device k.
        assert any("backward" in fn for fn in on_k), (k, calls)
        assert len(on_k) >= 2 * 2, (k, calls)
    assert {device for device, _ in calls} == {"/device:CPU:0", "/device:CPU:1"}


def test_compiled_fprop_under_a_tape_and_batch_norm_refused():
    x = tf.random.stateless_normal([8, DIMS], seed=[3, 4])
    cells = [Mlp() for _ in range(4)]
    plain = Pipeline(cells, 2, 2)
    compiled = Pipeline(cells, 2, 2, jit_compile_stages=True)
    for a, b in zip(compiled.trainable_variables, plain.trainable_variables):
        a.assign(b)

    def Grads(pipe):
        def Run():
            with tf.GradientTape() as tape:
                loss = Loss(pipe.FProp(pipe.theta, x)).loss[0]
            return loss, tape.gradient(loss, pipe.trainable_variables)

        return tf.function(Run, autograph=False)()

    (loss, grads), (want_loss, want_grads) = Grads(compiled), Grads(plain)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    for g, w in zip(grads, want_grads):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    with pytest.raises(
        ValueError, match=r"pipe: jit_compile_stages=True cannot compile .*BatchNormLayer"
    ):
        Pipeline([MlpWithBatchNorm()] * 2, 2, 2, jit_compile_stages=True)
