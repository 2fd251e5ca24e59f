"""Pooling over the spatial dims of NHWC inputs [batch, height, width, channels].

Output sizes follow TensorFlow (see `conv.OutputSpatialShape`). AVG pooling with
padding 'SAME' averages only the input positions inside each window, as tf.nn.avg_pool2d.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from lingpipe import asserts, base_layer, hyperparams
from lingpipe.layers import conv
from lingpipe.nested_map import NestedMap

__all__ = [
    "GlobalPoolingLayer",
    "POOLING_TYPES",
    "Pooling2DLayer",
]

POOLING_TYPES = ("MAX", "AVG")


def _CheckPoolingType(pooling_type: Any, where: str) -> None:
    asserts.In(pooling_type, POOLING_TYPES, "pooling_type", where=where)


class Pooling2DLayer(base_layer.BaseLayer):
    """Max or average pooling: [batch, height, width, c] -> [batch, height', width', c].

    No variables.
    """

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("window_shape", (2, 2), "Window (height, width).")
        p.Define("window_stride", (2, 2), "Strides (height, width).")
        p.Define("pooling_type", "MAX", f"One of {POOLING_TYPES}.")
        p.Define("padding", "SAME", f"One of {conv.PADDINGS}.")
        return p

    @classmethod
    def _CheckParams(cls, p: hyperparams.Params, where: str) -> None:
        conv.CheckInts(p.window_shape, ("height", "width"), "window_shape", where)
        conv.CheckInts(p.window_stride, ("height", "width"), "window_stride", where)
        _CheckPoolingType(p.pooling_type, where)
        conv.CheckPadding(p.padding, where)

    @classmethod
    def _OutputShape(
        cls, p: hyperparams.Params, shape: tf.TensorShape, where: str
    ) -> tf.TensorShape:
        height, width = conv.OutputSpatialShape(
            shape, p.window_shape, p.window_stride, p.padding, (1, 1), where
        )
        if shape.rank is None:
            return tf.TensorShape([None, height, width, None])
        return tf.TensorShape([shape[0], height, width, shape[3]])

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        self._CheckParams(self.params, self.path)

    def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
        """inputs: [batch, height, width, channels] -> [batch, height', width', channels]."""
        p = self.params
        self._OutputShape(p, conv.CheckNHWC(inputs.shape, self.path), self.path)
        pool = tf.nn.max_pool2d if p.pooling_type == "MAX" else tf.nn.avg_pool2d
        return pool(
            inputs, ksize=list(p.window_shape), strides=list(p.window_stride), padding=p.padding
        )

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, inputs_shape: Any) -> NestedMap:
        """Output shape; FLOPs: one comparison (MAX) or addition (AVG) per window entry."""
        where = p.name or cls.__name__
        cls._CheckParams(p, where)
        out = cls._OutputShape(p, conv.CheckNHWC(inputs_shape, where), where)
        window = p.window_shape[0] * p.window_shape[1]
        return base_layer.Meta(out, conv.NumElements(out.as_list()) * window, 0)


class GlobalPoolingLayer(base_layer.BaseLayer):
    """Max or average over height and width: [batch, height, width, c] -> [batch, c].

    With keepdims the output is [batch, 1, 1, c]. No variables.
    """

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("pooling_type", "AVG", f"One of {POOLING_TYPES}.")
        p.Define("keepdims", False, "If True, output [batch, 1, 1, c] instead of [batch, c].")
        return p

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        _CheckPoolingType(self.params.pooling_type, self.path)

    def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
        """inputs: [batch, height, width, c] -> [batch, c] (or [batch, 1, 1, c])."""
        p = self.params
        conv.CheckNHWC(inputs.shape, self.path)
        reduce = tf.reduce_max if p.pooling_type == "MAX" else tf.reduce_mean
        return reduce(inputs, axis=[1, 2], keepdims=p.keepdims)

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, inputs_shape: Any) -> NestedMap:
        """Output shape; FLOPs: one comparison or addition per input element."""
        where = p.name or cls.__name__
        _CheckPoolingType(p.pooling_type, where)
        shape = conv.CheckNHWC(inputs_shape, where)
        if shape.rank is None:
            shape = tf.TensorShape([None] * 4)
        batch, channels = shape[0], shape[3]
        out = [batch, 1, 1, channels] if p.keepdims else [batch, channels]
        return base_layer.Meta(tf.TensorShape(out), conv.NumElements(shape.as_list()), 0)
