"""Logical-core annotations (the TPU placement): each stage's tensors go to its own core."""

import pytest
import tensorflow as tf
from gpipe_cells import DIMS, Mlp, Pipeline, SquareLoss

from lingpipe import test_utils
from lingpipe.pipeline.step import placement


class Recorder:
    """Stands in for TPUStrategy.experimental_assign_to_logical_device: marks and records."""

    def __init__(self):
        self.phase = "forward"
        self.calls = []

    def __call__(self, tensor, core):
        out = tf.identity(tensor, name=f"core{core}")
        self.calls.append((self.phase, core, out.op.device))
        return out


@pytest.mark.parametrize("remat", ["always", "never"])
def test_forward_outputs_and_backward_gradients_are_annotated_with_their_stage_core(remat):
    pipe = Pipeline([Mlp()] * 6, 3, 2, remat=remat)
    recorder = Recorder()
    x = tf.random.normal([4, DIMS])

    @tf.function(autograph=False)
    def Step():
        with placement.LogicalCores(recorder, pipe.devices):
            with tf.GradientTape() as tape:
                loss = SquareLoss(pipe(x))
            recorder.phase = "backward"
            return tape.gradient(loss, pipe.trainable_variables)

    grads = Step()
    assert all(g is not None for g in grads)
    for phase in ("forward", "backward"):
        calls = [(core, device) for p, core, device in recorder.calls if p == phase]
        # Each stage annotated its work on both micro-batches, on its own core.
        for core in range(3):
            assert sum(1 for c, _ in calls if c == core) >= 2, (phase, core)
        for core, device in calls:
            assert tf.DeviceSpec.from_string(device) == tf.DeviceSpec.from_string(
                pipe.devices[core]
            ), (phase, core, device)
    # The annotation changes nothing in the numbers.
    with tf.GradientTape() as tape:
        loss = SquareLoss(pipe(x))
    want = tape.gradient(loss, pipe.trainable_variables)
    test_utils.AssertAllCloseToScale([g.numpy() for g in grads], [g.numpy() for g in want])


def test_no_annotation_outside_the_context_and_unknown_devices_are_refused():
    t = tf.constant([1.0])
    assert placement.Annotate("/device:CPU:5", t) is t
    with placement.LogicalCores(lambda x, k: x, ["/device:CPU:0"]):
        with pytest.raises(ValueError, match=r"stage device '/device:CPU:5' is not one of"):
            placement.Annotate("/device:CPU:5", t)
