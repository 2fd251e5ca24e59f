"""Softmax cross-entropy: a function over logits, and a layer that makes the logits.

`CrossEntropy` serves models that compute their own logits (e.g. tied embeddings,
`EmbeddingLayer.Logits`); `SimpleFullSoftmax` is Lingvo's full softmax layer: a
projection to `num_classes` followed by `CrossEntropy`.

    sm = SimpleFullSoftmax.Params().Set(name='softmax', input_dims=512, num_classes=32000)
    out = sm.Instantiate()(inputs, class_ids=labels, class_weights=paddings_mask)
    loss = out.avg_xent
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from lingpipe import asserts, base_layer, hyperparams
from lingpipe.layers import linear
from lingpipe.nested_map import NestedMap

__all__ = [
    "CheckLabelSmoothing",
    "CrossEntropy",
    "SimpleFullSoftmax",
]

# Rough cost of log-softmax plus the cross-entropy, per logit (exp, sum, log, sub, mul-add).
_XENT_FLOPS_PER_LOGIT = 5


def _Prefix(where: str) -> str:
    return f"{where}: " if where else ""


def CheckLabelSmoothing(label_smoothing: Any, where: str = "") -> float:
    """Returns label_smoothing as a float, or raises ValueError unless 0 <= it < 1."""
    ok = isinstance(label_smoothing, (int, float)) and not isinstance(label_smoothing, bool)
    if not ok or not 0.0 <= label_smoothing < 1.0:
        raise ValueError(
            f"{_Prefix(where)}expected 0 <= label_smoothing < 1, "
            f"received label_smoothing={label_smoothing!r}"
        )
    return float(label_smoothing)


def _Tiny(dtype: tf.DType) -> float:
    if dtype == tf.bfloat16:  # Same exponent range as float32; NumPy has no finfo for it.
        return float(np.finfo(np.float32).tiny)
    return float(np.finfo(dtype.as_numpy_dtype).tiny)


def _CheckShape(tensor: tf.Tensor, expected: tf.TensorShape, name: str, where: str) -> None:
    if not tensor.shape.is_compatible_with(expected):
        raise ValueError(
            f"{_Prefix(where)}expected {name}.shape == {expected} to match logits, "
            f"received {name}.shape={tensor.shape}"
        )


def CrossEntropy(
    logits: tf.Tensor,
    class_ids: tf.Tensor | None = None,
    class_weights: tf.Tensor | None = None,
    class_probabilities: tf.Tensor | None = None,
    label_smoothing: float = 0.0,
    *,
    where: str = "",
) -> NestedMap:
    """Softmax cross-entropy of `logits` against class ids or a target distribution.

    Args:
      logits: [..., num_classes], float.
      class_ids: int [...], the target class of each example. Exactly one of
        class_ids and class_probabilities must be given.
      class_weights: [...], float weight of each example; None means ones. Examples of
        weight 0 (padding) count neither in total_xent nor in total_weight.
      class_probabilities: [..., num_classes], the target distribution of each example.
      label_smoothing: in [0, 1): targets become (1 - ls) * targets + ls / num_classes
        (targets is one-hot of class_ids, or class_probabilities).
      where: prefix of error messages (a layer path).

    Returns:
      NestedMap(logits [..., C], log_probs [..., C], per_example_xent [...],
      per_example_argmax int32 [...], total_xent (sum of weight * xent), total_weight
      (sum of weights), avg_xent = total_xent / max(total_weight, tiny)).
    """
    label_smoothing = CheckLabelSmoothing(label_smoothing, where)
    if (class_ids is None) == (class_probabilities is None):
        given = "both" if class_ids is not None else "neither"
        raise ValueError(
            f"{_Prefix(where)}expected exactly one of class_ids and class_probabilities, "
            f"received {given}"
        )
    logits = tf.convert_to_tensor(logits)
    if not logits.dtype.is_floating:
        raise ValueError(
            f"{_Prefix(where)}expected floating-point logits, received logits.dtype="
            f"{logits.dtype.name}"
        )
    if logits.shape.rank == 0:
        raise ValueError(f"{_Prefix(where)}expected logits of rank >= 1, received a scalar")
    dtype = logits.dtype
    batch_shape = logits.shape[:-1] if logits.shape.rank is not None else tf.TensorShape(None)
    num_classes = tf.shape(logits)[-1]
    log_probs = tf.nn.log_softmax(logits)

    if class_ids is not None:
        class_ids = tf.convert_to_tensor(class_ids)
        if not class_ids.dtype.is_integer:
            raise ValueError(
                f"{_Prefix(where)}expected integer class_ids, received class_ids.dtype="
                f"{class_ids.dtype.name}"
            )
        _CheckShape(class_ids, batch_shape, "class_ids", where)
        if class_ids.dtype not in (tf.int32, tf.int64):
            class_ids = tf.cast(class_ids, tf.int32)
        if label_smoothing == 0.0:
            per_example_xent = tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=class_ids, logits=logits
            )
            targets = None
        else:
            targets = tf.one_hot(class_ids, num_classes, dtype=dtype)
    else:
        targets = tf.convert_to_tensor(class_probabilities, dtype=dtype)
        _CheckShape(targets, logits.shape, "class_probabilities", where)
    if targets is not None:
        if label_smoothing > 0.0:
            uniform = label_smoothing / tf.cast(num_classes, dtype)
            targets = (1.0 - label_smoothing) * targets + uniform
        per_example_xent = tf.nn.softmax_cross_entropy_with_logits(labels=targets, logits=logits)

    if class_weights is None:
        class_weights = tf.ones_like(per_example_xent)
    else:
        class_weights = tf.convert_to_tensor(class_weights, dtype=dtype)
        _CheckShape(class_weights, batch_shape, "class_weights", where)
    total_xent = tf.reduce_sum(per_example_xent * class_weights)
    total_weight = tf.reduce_sum(class_weights)
    return NestedMap(
        logits=logits,
        log_probs=log_probs,
        per_example_xent=per_example_xent,
        per_example_argmax=tf.argmax(logits, axis=-1, output_type=tf.int32),
        total_xent=total_xent,
        total_weight=total_weight,
        avg_xent=total_xent / tf.maximum(total_weight, _Tiny(dtype)),
    )


class SimpleFullSoftmax(base_layer.BaseLayer):
    """logits = inputs @ weight + bias over all num_classes, then CrossEntropy."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("input_dims", 0, "Size of the last dimension of the inputs.")
        p.Define("num_classes", 0, "Number of classes (the size of the logits' last dimension).")
        p.Define("has_bias", True, "Whether to add a bias [num_classes] to the logits.")
        p.Define(
            "label_smoothing",
            0.0,
            "In [0, 1): targets become (1 - label_smoothing) * targets + "
            "label_smoothing / num_classes.",
        )
        return p

    @classmethod
    def _CheckParams(cls, p: hyperparams.Params, where: str) -> None:
        asserts.Positive(p.input_dims, "input_dims", where=where)
        asserts.Positive(p.num_classes, "num_classes", where=where)
        if not isinstance(p.has_bias, bool):
            raise ValueError(f"{where}: expected has_bias to be a bool, received {p.has_bias!r}")
        CheckLabelSmoothing(p.label_smoothing, where)

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        self._CheckParams(p, self.path)
        self.CreateVariable("weight", base_layer.WeightParams([p.input_dims, p.num_classes]))
        if p.has_bias:
            self.CreateVariable(
                "bias",
                base_layer.WeightParams([p.num_classes], init=base_layer.WeightInit.Constant(0.0)),
            )

    def Logits(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
        """inputs: [..., input_dims] -> logits [..., num_classes]."""
        p = self.params
        inputs = tf.convert_to_tensor(inputs, dtype=self.fprop_dtype)
        linear.CheckLastDim(inputs, p.input_dims, "input_dims", self.path)
        logits = linear.MatMulLastDim(inputs, tf.cast(theta.weight, self.fprop_dtype))
        if p.has_bias:
            logits += tf.cast(theta.bias, self.fprop_dtype)
        return logits

    def FProp(
        self,
        theta: NestedMap,
        inputs: tf.Tensor,
        class_ids: tf.Tensor | None = None,
        class_weights: tf.Tensor | None = None,
        class_probabilities: tf.Tensor | None = None,
    ) -> NestedMap:
        """inputs: [..., input_dims]; class_ids int [...] or class_probabilities
        [..., num_classes] (exactly one); class_weights [...] (None: ones).

        Returns CrossEntropy's NestedMap (logits, log_probs, per_example_xent,
        per_example_argmax, total_xent, total_weight, avg_xent).
        """
        return CrossEntropy(
            self.Logits(theta, inputs),
            class_ids=class_ids,
            class_weights=class_weights,
            class_probabilities=class_probabilities,
            label_smoothing=self.params.label_smoothing,
            where=self.path,
        )

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, input_shape: Any, *target_shapes: Any) -> NestedMap:
        """input_shape [..., input_dims] -> out_shapes ([..., num_classes],) (the logits).

        `target_shapes` (of class_ids, weights, ...) do not change the result.
        """
        cls._CheckParams(p, p.name)
        shape = base_layer.ToShape(input_shape)
        if shape.rank is None or shape.rank == 0:
            raise ValueError(f"{p.name}: FPropMeta expects a shape of rank >= 1, received {shape}")
        asserts.Eq(shape[-1], p.input_dims, "input_shape[-1]", "input_dims", where=p.name)
        if not shape[:-1].is_fully_defined():
            raise ValueError(
                f"{p.name}: FPropMeta needs every input dim known to count FLOPs, received {shape}"
            )
        rows = int(np.prod(shape[:-1].as_list(), dtype=np.int64))
        logits = rows * p.num_classes
        flops = 2 * logits * p.input_dims + _XENT_FLOPS_PER_LOGIT * logits
        num_params = p.input_dims * p.num_classes
        if p.has_bias:
            flops += logits
            num_params += p.num_classes
        return base_layer.Meta(shape[:-1].concatenate([p.num_classes]), flops, num_params)
