"""Linear layers: a matmul (LinearLayer), a bias (BiasLayer), and both plus an activation.

`ProjectionLayer` is Lingvo's fully connected layer: `act(inputs @ w + b)`. All of
them act on the last dimension of inputs of any rank >= 1.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from lingpipe import asserts, base_layer, hyperparams
from lingpipe.layers import activations
from lingpipe.nested_map import NestedMap

__all__ = [
    "BiasLayer",
    "CheckLastDim",
    "LinearLayer",
    "MatMulLastDim",
    "ProjectionLayer",
    "RowsOf",
]


def MatMulLastDim(inputs: tf.Tensor, w: tf.Tensor, transpose_w: bool = False) -> tf.Tensor:
    """inputs [..., d] times w [d, n] (or w [n, d] with transpose_w) -> [..., n].

    Not tf.einsum('...i,io->...o'): its gradient for w materializes the whole
    [..., i, o] outer product before reducing it (8 GiB for a 1024 x 1024 layer
    on a batch of 1024); tensordot reshapes to one 2-D matmul instead.
    """
    return tf.tensordot(inputs, w, [[inputs.shape.rank - 1], [1 if transpose_w else 0]])


def CheckLastDim(inputs: tf.Tensor, dims: int, dims_name: str, where: str) -> None:
    """Raises ValueError unless inputs has rank >= 1 and a last dim of `dims` (when static)."""
    shape = base_layer.ToShape(inputs.shape)
    if shape.rank is None:
        return
    if shape.rank == 0:
        raise ValueError(
            f"{where}: expected inputs of rank >= 1 with inputs.shape[-1] == {dims_name}, "
            f"received a scalar"
        )
    if shape[-1] is not None:
        asserts.Eq(shape[-1], dims, "inputs.shape[-1]", dims_name, where=where)


def RowsOf(shape: Any, dims: int, dims_name: str, where: str) -> tuple[tf.TensorShape, int]:
    """(shape, number of rows) of an FPropMeta input shape whose last dim must be `dims`.

    Rows are the product of all dims but the last; they must be known to count FLOPs.
    """
    shape = base_layer.ToShape(shape)
    if shape.rank is None or shape.rank == 0:
        raise ValueError(
            f"{where}: FPropMeta expects an input shape of rank >= 1, received {shape}"
        )
    asserts.Eq(shape[-1], dims, "input_shape[-1]", dims_name, where=where)
    if not shape[:-1].is_fully_defined():
        raise ValueError(
            f"{where}: FPropMeta needs every input dim known to count FLOPs, received {shape}"
        )
    return shape, int(np.prod(shape[:-1].as_list(), dtype=np.int64))


class LinearLayer(base_layer.BaseLayer):
    """outputs = inputs @ w, over the last dim; no bias, no activation."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("input_dims", 0, "Size of the last dimension of the inputs.")
        p.Define("output_dims", 0, "Size of the last dimension of the outputs.")
        return p

    @classmethod
    def _CheckParams(cls, p: hyperparams.Params, where: str) -> None:
        asserts.Positive(p.input_dims, "input_dims", where=where)
        asserts.Positive(p.output_dims, "output_dims", where=where)

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        self._CheckParams(p, self.path)
        self.CreateVariable("w", base_layer.WeightParams([p.input_dims, p.output_dims]))

    def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
        """inputs: [..., input_dims] -> [..., output_dims]."""
        p = self.params
        inputs = tf.convert_to_tensor(inputs, dtype=self.fprop_dtype)
        CheckLastDim(inputs, p.input_dims, "input_dims", self.path)
        w = tf.cast(theta.w, self.fprop_dtype)
        return MatMulLastDim(inputs, w)

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, input_shape: Any) -> NestedMap:
        cls._CheckParams(p, p.name)
        shape, rows = RowsOf(input_shape, p.input_dims, "input_dims", p.name)
        flops = 2 * rows * p.input_dims * p.output_dims
        return base_layer.Meta(
            shape[:-1].concatenate([p.output_dims]), flops, p.input_dims * p.output_dims
        )


class BiasLayer(base_layer.BaseLayer):
    """outputs = inputs + b, over the last dim; b starts at 0."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("dims", 0, "Size of the last dimension of the inputs (and of b).")
        return p

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        asserts.Positive(p.dims, "dims", where=self.path)
        self.CreateVariable(
            "b", base_layer.WeightParams([p.dims], init=base_layer.WeightInit.Constant(0.0))
        )

    def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
        """inputs: [..., dims] -> [..., dims]."""
        p = self.params
        inputs = tf.convert_to_tensor(inputs, dtype=self.fprop_dtype)
        CheckLastDim(inputs, p.dims, "dims", self.path)
        return inputs + tf.cast(theta.b, self.fprop_dtype)

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, input_shape: Any) -> NestedMap:
        asserts.Positive(p.dims, "dims", where=p.name)
        shape, rows = RowsOf(input_shape, p.dims, "dims", p.name)
        return base_layer.Meta(shape, rows * p.dims, p.dims)


class ProjectionLayer(base_layer.BaseLayer):
    """A fully connected layer: outputs = act(inputs @ w + b), over the last dim."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("input_dims", 0, "Size of the last dimension of the inputs.")
        p.Define("output_dims", 0, "Size of the last dimension of the outputs.")
        p.Define(
            "activation",
            "RELU",
            f"Activation after the bias, by name (case-insensitive): one of {activations.NAMES}.",
        )
        p.Define("has_bias", True, "Whether to add a bias b [output_dims] before the activation.")
        p.Define("bias_init", 0.0, "Initial value of every element of b.")
        return p

    @classmethod
    def _CheckParams(cls, p: hyperparams.Params, where: str) -> None:
        asserts.Positive(p.input_dims, "input_dims", where=where)
        asserts.Positive(p.output_dims, "output_dims", where=where)
        activations.Check(p.activation, where=where)
        if not isinstance(p.has_bias, bool):
            raise ValueError(f"{where}: expected has_bias to be a bool, received {p.has_bias!r}")

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        self._CheckParams(p, self.path)
        self.CreateVariable("w", base_layer.WeightParams([p.input_dims, p.output_dims]))
        if p.has_bias:
            init = base_layer.WeightInit.Constant(float(p.bias_init))
            self.CreateVariable("b", base_layer.WeightParams([p.output_dims], init=init))

    def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
        """inputs: [..., input_dims] -> [..., output_dims]."""
        p = self.params
        inputs = tf.convert_to_tensor(inputs, dtype=self.fprop_dtype)
        CheckLastDim(inputs, p.input_dims, "input_dims", self.path)
        out = MatMulLastDim(inputs, tf.cast(theta.w, self.fprop_dtype))
        if p.has_bias:
            out += tf.cast(theta.b, self.fprop_dtype)
        return activations.GetFn(p.activation, where=self.path)(out)

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, input_shape: Any) -> NestedMap:
        cls._CheckParams(p, p.name)
        shape, rows = RowsOf(input_shape, p.input_dims, "input_dims", p.name)
        per_output = activations.FlopsPerElement(p.activation) + (1 if p.has_bias else 0)
        flops = rows * p.output_dims * (2 * p.input_dims + per_output)
        num_params = p.input_dims * p.output_dims + (p.output_dims if p.has_bias else 0)
        return base_layer.Meta(shape[:-1].concatenate([p.output_dims]), flops, num_params)
