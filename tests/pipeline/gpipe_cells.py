"""Cells and helpers shared by the PipeliningLayer tests."""

import re

import numpy as np
import tensorflow as tf

from lingpipe import base_layer, test_utils
from lingpipe.layers import dropout, gpipe, linear, normalization, sequential, transformer
from lingpipe.nested_map import NestedMap

DIMS = 8


def Mlp(activation="TANH"):
    return linear.ProjectionLayer.Params().Set(
        input_dims=DIMS, output_dims=DIMS, activation=activation
    )


def MlpWithDropout(keep_prob=0.7):
    return sequential.SequentialLayer.Params().Set(
        sub=[Mlp(), dropout.DropoutLayer.Params().Set(keep_prob=keep_prob)]
    )


def MlpWithBatchNorm():
    return sequential.SequentialLayer.Params().Set(
        sub=[Mlp(), normalization.BatchNormLayer.Params().Set(dim=DIMS, decay=0.9)]
    )


class TransformerCell(base_layer.BaseLayer):
    """A transformer layer whose inputs and outputs are the same (x, paddings) state."""

    @classmethod
    def Params(cls):
        p = super().Params()
        p.Define("layer", transformer.TransformerLayer.Params(), "The transformer layer.")
        return p

    def __init__(self, params):
        super().__init__(params)
        self.CreateChild("layer", self.params.layer)

    def FProp(self, theta, x, paddings):
        return self.layer.FProp(theta.layer, x, paddings=paddings), paddings

    @classmethod
    def FPropMeta(cls, p, x, paddings):
        meta = p.layer.cls.FPropMeta(p.layer, x, paddings)
        return base_layer.Meta(
            (meta.out_shapes[0], base_layer.ToShape(paddings)), meta.flops, meta.num_params
        )


def Transformer(dropout_prob=0.0, causal=True):
    layer = transformer.TransformerLayer.Params().Set(
        input_dims=DIMS, num_heads=2, hidden_dims=16, causal=causal, dropout_prob=dropout_prob
    )
    return TransformerCell.Params().Set(layer=layer)


class SkipCell(base_layer.BaseLayer):
    """NestedMap state: 'save' stores x in state.skip, 'add' adds it back; both project x."""

    @classmethod
    def Params(cls):
        p = super().Params()
        p.Define("mode", "", "'save', 'add' or '' (project only).")
        p.Define("proj", Mlp(), "Projection of x.")
        return p

    def __init__(self, params):
        super().__init__(params)
        self.CreateChild("proj", self.params.proj)

    def FProp(self, theta, state):
        out = state.Copy()
        if self.params.mode == "save":
            out.skip = state.x
        out.x = self.proj.FProp(theta.proj, state.x)
        if self.params.mode == "add":
            out.x = out.x + state.skip
        return out


def Pipeline(cells, num_stages, num_micro_batches, remat="always", **kw):
    return (
        gpipe.PipeliningLayer.Params()
        .Set(
            name="pipe",
            cell_tpl=cells,
            num_stages=num_stages,
            num_micro_batches=num_micro_batches,
            remat=remat,
            **kw,
        )
        .Instantiate()
    )


def SquareLoss(outputs):
    x = outputs[0] if isinstance(outputs, tuple) else outputs
    x = x.x if isinstance(x, NestedMap) else x
    return tf.reduce_sum(tf.square(x)) + tf.reduce_sum(x)


def PipelineAndReference(pipe, args, loss_fn=SquareLoss, use_function=True):
    """(outputs, loss, grads) of the pipeline and of its sequential reference."""

    def Run(fprop):
        variables = pipe.trainable_variables
        with tf.GradientTape() as tape:
            outputs = fprop(pipe.theta, *args)
            loss = loss_fn(outputs)
        grads = tape.gradient(loss, variables)
        dense = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        return outputs, loss, dense

    def RunPipeline():
        return Run(pipe.FProp)

    def RunReference():
        return Run(pipe.FPropSequential)

    # The pipeline is traced as a train step would be (AutoGraph off: nothing here
    # needs it and it doubles the trace time); the reference runs eagerly.
    if use_function:
        return tf.function(RunPipeline, autograph=False)(), RunReference()
    return RunPipeline(), RunReference()


def AssertSame(got, want, rtol=test_utils.RTOL):
    """Outputs, loss and gradients equal to float32 rounding (relative to each tensor's scale)."""
    (out_g, loss_g, grads_g), (out_w, loss_w, grads_w) = got, want
    test_utils.AssertAllCloseToScale(out_g, out_w, rtol=rtol)
    np.testing.assert_allclose(loss_g.numpy(), loss_w.numpy(), rtol=rtol)
    assert all(g is not None for g in grads_g), "a variable got no gradient"
    # Against the scale of all gradients: some are 0 in exact arithmetic (an attention
    # key bias shifts every score of a query alike) and hold only rounding noise.
    scale = max(float(np.max(np.abs(g))) for g in grads_w)
    for i, (g, w) in enumerate(zip(grads_g, grads_w)):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * scale, err_msg=f"gradient {i}")


def PlainStack(pipe, *args):
    """The cells one after another on the whole batch, no micro-batches."""
    outputs = args
    for cell in pipe.Cells():
        outputs = cell.FProp(cell.theta, *sequential.AsArgs(outputs))
    return outputs


# The executor's scope of an action: F_s3_mb1/, B_s0_mb2/, ...
STAGE_SCOPE = re.compile(r"(?:^|/)[FBIW]_s(\d+)_mb\d+/")
_RESOURCE_OPS = {"Placeholder", "ReadVariableOp"}


def _CapturedDevices(graph):
    """Device of each captured resource, by the name of its placeholder op."""
    return {inner.op.name: outer.device for outer, inner in graph.captures}


def Misplaced(graph, device_of=lambda stage: stage):
    """Ops in a stage's scopes that are not on that stage's device (CPU:device_of(stage))."""
    captured = _CapturedDevices(graph)
    bad = []
    for op in graph.get_operations():
        m = STAGE_SCOPE.search(op.name)
        if not m:
            continue
        want = f"/device:CPU:{device_of(int(m.group(1)))}"
        device = op.device
        if op.type in _RESOURCE_OPS and not device:
            # A variable's handle and its reads run where the variable lives.
            handle = op if op.type == "Placeholder" else op.inputs[0].op
            device = tf.DeviceSpec.from_string(captured.get(handle.name, "")).to_string()
            device = "/device:" + device.split("/device:")[-1] if device else ""
        if device != want:
            bad.append((op.name, op.type, device))
    return bad


class BarrierCell(base_layer.BaseLayer):
    """Passes x through; (stage 0, micro-batch 1) and (stage 1, micro-batch 0) meet.

    A test sets `barrier` (threading.Barrier(2, timeout=...)) and empties `meetings`
    before it runs the pipeline; the meetings are recorded in `meetings`."""

    barrier = None
    meetings = []

    @classmethod
    def Params(cls):
        p = super().Params()
        p.Define("stage", 0, "Which stage this cell is on.")
        return p

    def FProp(self, theta, x):
        stage = self.params.stage

        def Wait(value):
            micro_batch = int(value[0, 0])  # rows of micro-batch m hold m
            if (stage, micro_batch) in ((0, 1), (1, 0)):
                BarrierCell.barrier.wait()  # raises BrokenBarrierError on timeout
                BarrierCell.meetings.append((stage, micro_batch))
            return value

        y = tf.numpy_function(Wait, [x], tf.float32, stateful=False)
        return tf.ensure_shape(y, x.shape)
