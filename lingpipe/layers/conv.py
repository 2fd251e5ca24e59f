"""2-D convolutions on NHWC inputs: plain, depthwise, and separable (depthwise + 1x1).

Inputs are [batch, height, width, channels]. Output spatial sizes follow TensorFlow:
SAME gives ceil(size / stride), VALID gives ceil((size - (window - 1) * dilation) / stride).
The helpers at the top (`CheckInts`, `CheckPadding`, `CheckNHWC`, `OutputSpatialShape`)
are shared with `pooling.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from lingpipe import asserts, base_layer, hyperparams
from lingpipe.layers import activations
from lingpipe.nested_map import NestedMap

__all__ = [
    "CheckInts",
    "CheckNHWC",
    "CheckPadding",
    "Conv2DLayer",
    "DepthwiseConv2DLayer",
    "NumElements",
    "OutputSpatialShape",
    "PADDINGS",
    "SeparableConv2DLayer",
]

PADDINGS = ("SAME", "VALID")


def CheckInts(value: Any, names: Sequence[str], param: str, where: str) -> tuple[int, ...]:
    """Returns `value` as a tuple of positive ints, one per entry of `names`, or raises."""
    if not isinstance(value, (list, tuple)) or len(value) != len(names):
        raise ValueError(
            f"{where}: expected {param} to have {len(names)} entries ({', '.join(names)}), "
            f"received {param}={value!r}"
        )
    for i, v in enumerate(value):
        asserts.Positive(v, f"{param}[{i}]", where=where, hint=f"{param}={tuple(value)!r}")
    return tuple(value)


def CheckPadding(padding: Any, where: str) -> None:
    asserts.In(padding, PADDINGS, "padding", where=where)


def CheckNHWC(shape: Any, where: str) -> tf.TensorShape:
    """The TensorShape of `shape`, checked to be rank 4 when the rank is known."""
    shape = base_layer.ToShape(shape)
    if shape.rank is not None and shape.rank != 4:
        raise ValueError(
            f"{where}: expected inputs of rank 4 [batch, height, width, channels], received "
            f"inputs.shape={shape.as_list()} (rank {shape.rank})"
        )
    return shape


def OutputSpatialShape(
    shape: tf.TensorShape,
    window: Sequence[int],
    stride: Sequence[int],
    padding: str,
    dilation: Sequence[int],
    where: str,
) -> list[int | None]:
    """[height', width'] of a window op over NHWC `shape`, as TensorFlow computes them."""
    if shape.rank is None:
        return [None, None]
    out = []
    for axis, name in ((1, "height"), (2, "width")):
        size, k, s, d = shape[axis], window[axis - 1], stride[axis - 1], dilation[axis - 1]
        if size is None:
            out.append(None)
        elif padding == "SAME":
            out.append(-(-size // s))
        else:
            effective = (k - 1) * d + 1
            asserts.Ge(
                size,
                effective,
                f"inputs.shape[{axis}]",
                f"the effective window {name} (window - 1) * dilation + 1",
                where=where,
                hint="padding='VALID' needs the window inside the input; use 'SAME'",
            )
            out.append(-(-(size - effective + 1) // s))
    return out


def NumElements(shape: Sequence[int | None]) -> int:
    """Product of the dims; an unknown dim (e.g. the batch) counts as 1."""
    n = 1
    for d in shape:
        n *= 1 if d is None else int(d)
    return n


class _WindowConv(base_layer.BaseLayer):
    """What Conv2DLayer and DepthwiseConv2DLayer share: params, checks, bias, activation."""

    _FILTER_NAMES = ("height", "width", "in_channels", "out_channels")

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("filter_shape", hyperparams.REQUIRED, f"Filter shape {cls._FILTER_NAMES}.")
        p.Define("filter_stride", (1, 1), "Strides (height, width).")
        p.Define("padding", "SAME", f"One of {PADDINGS}.")
        p.Define("dilation_rate", (1, 1), "Dilation (height, width); needs filter_stride 1.")
        p.Define("activation", "NONE", "Activation applied to the output, by name.")
        p.Define("has_bias", True, "Whether to add a bias per output channel.")
        p.Define("bias_init", base_layer.WeightInit.Constant(0.0), "Initializer of the bias.")
        return p

    @classmethod
    def _CheckParams(cls, p: hyperparams.Params, where: str) -> tuple[int, ...]:
        """Validates p; returns the filter shape as a tuple of ints."""
        filter_shape = CheckInts(p.filter_shape, cls._FILTER_NAMES, "filter_shape", where)
        stride = CheckInts(p.filter_stride, ("height", "width"), "filter_stride", where)
        dilation = CheckInts(p.dilation_rate, ("height", "width"), "dilation_rate", where)
        CheckPadding(p.padding, where)
        activations.Check(p.activation, where=where)
        if max(stride) > 1 and max(dilation) > 1:
            raise ValueError(
                f"{where}: expected filter_stride or dilation_rate to be all ones, received "
                f"filter_stride={stride}, dilation_rate={dilation}"
            )
        return filter_shape

    @classmethod
    def _OutChannels(cls, filter_shape: Sequence[int]) -> int:
        return filter_shape[3]

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        filter_shape = self._CheckParams(p, self.path)
        self.CreateVariable("w", base_layer.WeightParams(filter_shape))
        if p.has_bias:
            out = self._OutChannels(filter_shape)
            self.CreateVariable("b", base_layer.WeightParams([out], init=p.bias_init))

    def _CheckInputs(self, inputs: tf.Tensor) -> list[int | None]:
        """Checks rank and channels of inputs; returns the output's [height, width]."""
        p = self.params
        shape = CheckNHWC(inputs.shape, self.path)
        if shape.rank is not None and shape[3] is not None:
            asserts.Eq(
                shape[3], p.filter_shape[2], "inputs.shape[-1]", "filter_shape[2]", where=self.path
            )
        return OutputSpatialShape(
            shape, p.filter_shape, p.filter_stride, p.padding, p.dilation_rate, self.path
        )

    def _BiasAndActivation(self, theta: NestedMap, outputs: tf.Tensor) -> tf.Tensor:
        p = self.params
        if p.has_bias:
            outputs = tf.nn.bias_add(outputs, tf.cast(theta.b, outputs.dtype))
        return activations.GetFn(p.activation, where=self.path)(outputs)

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, inputs_shape: Any) -> NestedMap:
        """Output shape [batch, height', width', out], FLOPs and parameters of FProp."""
        where = p.name or cls.__name__
        filter_shape = cls._CheckParams(p, where)
        shape = CheckNHWC(inputs_shape, where)
        if shape.rank is None:
            shape = tf.TensorShape([None] * 4)
        if shape[3] is not None:
            asserts.Eq(
                shape[3], filter_shape[2], "inputs.shape[-1]", "filter_shape[2]", where=where
            )
        height, width = OutputSpatialShape(
            shape, filter_shape, p.filter_stride, p.padding, p.dilation_rate, where
        )
        out = cls._OutChannels(filter_shape)
        # Plain and depthwise alike: one multiply-add per filter entry per output position.
        per_position = 2 * NumElements(filter_shape)
        per_position += out * (int(p.has_bias) + activations.FlopsPerElement(p.activation))
        num_params = NumElements(filter_shape) + (out if p.has_bias else 0)
        return base_layer.Meta(
            tf.TensorShape([shape[0], height, width, out]),
            NumElements([shape[0], height, width]) * per_position,
            num_params,
        )


class Conv2DLayer(_WindowConv):
    """2-D convolution: inputs [batch, height, width, in] -> [batch, height', width', out].

    Variables: `w` [filter_height, filter_width, in, out] and, with has_bias, `b` [out].
    """

    def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
        """inputs: [batch, height, width, in_channels] -> [batch, height', width', out]."""
        p = self.params
        self._CheckInputs(inputs)
        outputs = tf.nn.conv2d(
            inputs,
            tf.cast(theta.w, self.fprop_dtype),
            strides=[1, *p.filter_stride, 1],
            padding=p.padding,
            dilations=[1, *p.dilation_rate, 1],
        )
        return self._BiasAndActivation(theta, outputs)


class DepthwiseConv2DLayer(_WindowConv):
    """Depthwise 2-D convolution: each input channel gets its own `channel_multiplier` filters.

    inputs [batch, height, width, in] -> [batch, height', width', in * channel_multiplier];
    output channel `c * channel_multiplier + m` is input channel c through filter w[..., c, m].
    Variables: `w` [filter_height, filter_width, in, channel_multiplier] and, with has_bias,
    `b` [in * channel_multiplier].
    """

    _FILTER_NAMES = ("height", "width", "in_channels", "channel_multiplier")

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Set(has_bias=False)
        return p

    @classmethod
    def _OutChannels(cls, filter_shape: Sequence[int]) -> int:
        return filter_shape[2] * filter_shape[3]

    def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
        """inputs: [batch, height, width, in] -> [batch, height', width', in * multiplier]."""
        p = self.params
        self._CheckInputs(inputs)
        outputs = tf.nn.depthwise_conv2d(
            inputs,
            tf.cast(theta.w, self.fprop_dtype),
            strides=[1, *p.filter_stride, 1],
            padding=p.padding,
            dilations=list(p.dilation_rate),
        )
        return self._BiasAndActivation(theta, outputs)


class SeparableConv2DLayer(base_layer.BaseLayer):
    """Depthwise convolution, then a 1x1 convolution to `out` channels (no nonlinearity between).

    inputs [batch, height, width, in] -> [batch, height', width', out]. Children:
    `depthwise` (DepthwiseConv2DLayer, filter [h, w, in, depth_multiplier], no bias) and
    `pointwise` (Conv2DLayer, filter [1, 1, in * depth_multiplier, out], with the bias and
    the activation).
    """

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define(
            "filter_shape",
            hyperparams.REQUIRED,
            "Filter shape (height, width, in_channels, out_channels).",
        )
        p.Define("depth_multiplier", 1, "Depthwise filters per input channel.")
        p.Define("filter_stride", (1, 1), "Strides (height, width) of the depthwise step.")
        p.Define("padding", "SAME", f"One of {PADDINGS}.")
        p.Define("dilation_rate", (1, 1), "Dilation of the depthwise step; needs stride 1.")
        p.Define("activation", "NONE", "Activation applied to the output, by name.")
        p.Define("has_bias", True, "Whether the pointwise step adds a bias.")
        p.Define("bias_init", base_layer.WeightInit.Constant(0.0), "Initializer of the bias.")
        return p

    @classmethod
    def _ChildParams(
        cls, p: hyperparams.Params, where: str
    ) -> tuple[hyperparams.Params, hyperparams.Params]:
        """Params of the depthwise and pointwise children, after validating p."""
        names = ("height", "width", "in_channels", "out_channels")
        h, w, cin, cout = CheckInts(p.filter_shape, names, "filter_shape", where)
        asserts.Positive(p.depth_multiplier, "depth_multiplier", where=where)
        mult = p.depth_multiplier
        depthwise = DepthwiseConv2DLayer.Params().Set(
            name="depthwise",
            filter_shape=(h, w, cin, mult),
            filter_stride=p.filter_stride,
            padding=p.padding,
            dilation_rate=p.dilation_rate,
            has_bias=False,
        )
        pointwise = Conv2DLayer.Params().Set(
            name="pointwise",
            filter_shape=(1, 1, cin * mult, cout),
            padding="VALID",
            activation=p.activation,
            has_bias=p.has_bias,
            bias_init=p.bias_init.Copy(),
        )
        return depthwise, pointwise

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        depthwise, pointwise = self._ChildParams(self.params, self.path)
        self.CreateChild("depthwise", depthwise)
        self.CreateChild("pointwise", pointwise)

    def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
        """inputs: [batch, height, width, in_channels] -> [batch, height', width', out]."""
        hidden = self.depthwise.FProp(theta.depthwise, inputs)
        return self.pointwise.FProp(theta.pointwise, hidden)

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, inputs_shape: Any) -> NestedMap:
        """The depthwise child's meta composed with the pointwise child's."""
        where = p.name or cls.__name__
        depthwise, pointwise = cls._ChildParams(p, where)
        depthwise.name, pointwise.name = f"{where}/depthwise", f"{where}/pointwise"
        first = DepthwiseConv2DLayer.FPropMeta(depthwise, inputs_shape)
        second = Conv2DLayer.FPropMeta(pointwise, first.out_shapes[0])
        return base_layer.Meta(
            second.out_shapes, first.flops + second.flops, first.num_params + second.num_params
        )
