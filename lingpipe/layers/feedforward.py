"""FeedForwardNet: a stack of fully connected layers (ProjectionLayer), one per hidden dim."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from lingpipe import asserts, base_layer, hyperparams
from lingpipe.layers import activations, linear
from lingpipe.nested_map import NestedMap

__all__ = [
    "FeedForwardNet",
]


def _PerLayer(value: Any, name: str, num_layers: int, where: str) -> list[Any]:
    """`value` repeated for each layer, or the list itself once its length is checked."""
    if not isinstance(value, (list, tuple)):
        return [value] * num_layers
    if len(value) != num_layers:
        raise ValueError(
            f"{where}: expected len({name}) == len(hidden_layer_dims), received "
            f"len({name})={len(value)} ({name}={list(value)!r}), "
            f"len(hidden_layer_dims)={num_layers}; give one value per layer or a single value"
        )
    return list(value)


class FeedForwardNet(base_layer.BaseLayer):
    """inputs -> fc[0] -> fc[1] -> ... -> outputs, each fc a ProjectionLayer.

    Layer i maps hidden_layer_dims[i-1] (input_dims for i = 0) to hidden_layer_dims[i]
    and applies its activation; its variables are `<path>/fc_<i>/w` and `.../b`.
    """

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("input_dims", 0, "Size of the last dimension of the inputs.")
        p.Define("hidden_layer_dims", [], "Output dims of each layer, in order (non-empty).")
        p.Define(
            "activation",
            "RELU",
            "Activation of every layer (a name), or a list of names, one per layer.",
        )
        p.Define("has_bias", True, "Whether layers have a bias: a bool, or a list, one per layer.")
        return p

    @classmethod
    def _LayerParams(cls, p: hyperparams.Params, where: str) -> list[hyperparams.Params]:
        """Validates p and returns the ProjectionLayer params of each layer."""
        asserts.Positive(p.input_dims, "input_dims", where=where)
        dims = p.hidden_layer_dims
        if not isinstance(dims, (list, tuple)) or not dims:
            raise ValueError(
                f"{where}: expected hidden_layer_dims to be a non-empty list of positive "
                f"integers, received hidden_layer_dims={dims!r}"
            )
        for i, d in enumerate(dims):
            asserts.Positive(d, f"hidden_layer_dims[{i}]", where=where)
        acts = _PerLayer(p.activation, "activation", len(dims), where)
        biases = _PerLayer(p.has_bias, "has_bias", len(dims), where)
        layer_params = []
        in_dims = p.input_dims
        for i, (out_dims, act, has_bias) in enumerate(zip(dims, acts, biases)):
            activations.Check(act, where=f"{where}/fc_{i}")
            layer_params.append(
                linear.ProjectionLayer.Params().Set(
                    name=f"fc_{i}",
                    input_dims=in_dims,
                    output_dims=out_dims,
                    activation=act,
                    has_bias=has_bias,
                )
            )
            in_dims = out_dims
        return layer_params

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        self.CreateChildren("fc", self._LayerParams(p, self.path))

    def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
        """inputs: [..., input_dims] -> [..., hidden_layer_dims[-1]]."""
        p = self.params
        inputs = tf.convert_to_tensor(inputs, dtype=self.fprop_dtype)
        linear.CheckLastDim(inputs, p.input_dims, "input_dims", self.path)
        out = inputs
        for layer, layer_theta in zip(self.fc, theta.fc):
            out = layer.FProp(layer_theta, out)
        return out

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, input_shape: Any) -> NestedMap:
        layer_params = cls._LayerParams(p, p.name)
        shape, _ = linear.RowsOf(input_shape, p.input_dims, "input_dims", p.name)
        flops = num_params = 0
        for layer_p in layer_params:
            meta = linear.ProjectionLayer.FPropMeta(layer_p, shape)
            (shape,) = meta.out_shapes
            flops += meta.flops
            num_params += meta.num_params
        return base_layer.Meta(shape, flops, num_params)
