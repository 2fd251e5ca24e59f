"""Multi-headed scaled dot-product attention, batch-major ([batch, time, dims])."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import tensorflow as tf

from lingpipe import asserts, base_layer, hyperparams
from lingpipe.layers import dropout
from lingpipe.nested_map import NestedMap

__all__ = [
    "LargeNegative",
    "MultiHeadedAttention",
]


def LargeNegative(dtype: tf.DType) -> float:
    """A logit that softmax turns into an exact 0 without overflowing `dtype` to -inf.

    -inf would give NaN on a row where every key is masked; -1e9 overflows float16.
    """
    return -min(1e9, 0.7 * float(np.finfo(dtype.as_numpy_dtype).max))


class MultiHeadedAttention(base_layer.BaseLayer):
    """Attention of queries over keys and values with `num_heads` heads.

    Each input is projected to `hidden_dims` and split into heads of
    hidden_dims // num_heads; the heads' contexts are concatenated and projected
    back to `input_dims` by `w_post`.
    """

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("input_dims", 0, "Last dimension of query, key and value inputs.")
        p.Define("hidden_dims", 0, "Total size of the projected heads; 0 means input_dims.")
        p.Define("num_heads", 1, "Number of attention heads; must divide hidden_dims.")
        p.Define(
            "causal",
            False,
            "If True, query position t attends only to key positions <= t (self-attention only).",
        )
        p.Define("atten_dropout_prob", 0.0, "Dropout probability on the attention probabilities.")
        p.Define("use_bias", True, "Whether the four projections have biases.")
        return p

    @classmethod
    def _HiddenDims(cls, p: hyperparams.Params) -> int:
        return p.hidden_dims or p.input_dims

    @classmethod
    def _Validate(cls, p: hyperparams.Params, where: str) -> None:
        asserts.Positive(p.input_dims, "input_dims", where=where)
        asserts.Positive(p.num_heads, "num_heads", where=where)
        if p.hidden_dims != 0:
            asserts.Positive(p.hidden_dims, "hidden_dims", where=where, hint="0 means input_dims")
        asserts.DivisibleBy(
            cls._HiddenDims(p), p.num_heads, "hidden_dims", "num_heads", where=where
        )
        if not 0.0 <= p.atten_dropout_prob < 1.0:
            raise ValueError(
                f"{where}: expected 0 <= atten_dropout_prob < 1, received "
                f"atten_dropout_prob={p.atten_dropout_prob!r}"
            )

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        self._Validate(p, self.path)
        d, h = p.input_dims, self._HiddenDims(p)
        for name in ("w_query", "w_key", "w_value"):
            self.CreateVariable(name, base_layer.WeightParams([d, h]))
        self.CreateVariable("w_post", base_layer.WeightParams([h, d]))
        if p.use_bias:
            zeros = base_layer.WeightInit.Constant(0.0)
            for name in ("b_query", "b_key", "b_value"):
                self.CreateVariable(name, base_layer.WeightParams([h], init=zeros))
            self.CreateVariable("b_post", base_layer.WeightParams([d], init=zeros))
        self.CreateChild(
            "atten_dropout",
            dropout.DropoutLayer.Params().Set(keep_prob=1.0 - p.atten_dropout_prob),
        )

    def _CheckDims(self, x: tf.Tensor, name: str) -> None:
        p = self.params
        if x.shape.rank is not None:
            asserts.Eq(x.shape.rank, 3, f"{name}.shape.rank", where=self.path)
            if x.shape[-1] is not None:
                asserts.Eq(
                    x.shape[-1], p.input_dims, f"{name}.shape[-1]", "input_dims", where=self.path
                )

    def _Project(self, theta: NestedMap, x: tf.Tensor, which: str) -> tf.Tensor:
        """[batch, time, input_dims] -> [batch, time, num_heads, head_dims]."""
        p = self.params
        n = p.num_heads
        w = tf.cast(theta[f"w_{which}"], x.dtype)
        w = tf.reshape(w, [p.input_dims, n, self._HiddenDims(p) // n])
        out = tf.einsum("btd,dnh->btnh", x, w)
        if p.use_bias:
            out += tf.reshape(tf.cast(theta[f"b_{which}"], x.dtype), [n, -1])
        return out

    def FProp(
        self,
        theta: NestedMap,
        query_vec: tf.Tensor,
        key_vec: tf.Tensor | None = None,
        value_vec: tf.Tensor | None = None,
        paddings: tf.Tensor | None = None,
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """Attends from query_vec over key_vec / value_vec.

        Args:
          theta: this layer's variables (NestedMap).
          query_vec: [batch, target_time, input_dims].
          key_vec: [batch, source_time, input_dims]; None means query_vec (self-attention).
          value_vec: [batch, source_time, input_dims]; None means key_vec.
          paddings: [batch, source_time], 1.0 at padded key positions (they get no
            attention), or None.

        Returns:
          (encoded [batch, target_time, input_dims],
           probs [batch, num_heads, target_time, source_time]: the attention
           probabilities before dropout).
        """
        p = self.params
        if p.causal and (key_vec is not None or value_vec is not None):
            raise ValueError(
                f"{self.path}: causal=True requires self-attention, received a key_vec or "
                f"value_vec; pass only query_vec, or set causal=False for cross-attention"
            )
        dtype = self.fprop_dtype
        query_vec = tf.convert_to_tensor(query_vec, dtype=dtype)
        key_vec = query_vec if key_vec is None else tf.convert_to_tensor(key_vec, dtype=dtype)
        value_vec = key_vec if value_vec is None else tf.convert_to_tensor(value_vec, dtype=dtype)
        self._CheckDims(query_vec, "query_vec")
        self._CheckDims(key_vec, "key_vec")
        self._CheckDims(value_vec, "value_vec")
        if key_vec.shape.rank == 3 and value_vec.shape.rank == 3:
            if key_vec.shape[1] is not None and value_vec.shape[1] is not None:
                asserts.Eq(
                    key_vec.shape[1],
                    value_vec.shape[1],
                    "key_vec.shape[1]",
                    "value_vec.shape[1]",
                    where=self.path,
                )

        q = self._Project(theta, query_vec, "query")
        k = self._Project(theta, key_vec, "key")
        v = self._Project(theta, value_vec, "value")
        q *= tf.cast(1.0 / math.sqrt(self._HiddenDims(p) // p.num_heads), dtype)
        # Softmax in at least float32: low-precision logits lose the masking margin.
        logits_dtype = tf.float32 if dtype.size < 4 else dtype
        logits = tf.cast(tf.einsum("btnh,bsnh->bnts", q, k), logits_dtype)

        mask = None  # True where attention is allowed, broadcast to [b, n, t, s].
        if paddings is not None:
            paddings = tf.convert_to_tensor(paddings)
            if paddings.shape.rank is not None:
                asserts.Eq(paddings.shape.rank, 2, "paddings.shape.rank", where=self.path)
                key_len = key_vec.shape[1] if key_vec.shape.rank == 3 else None
                if paddings.shape[1] is not None and key_len is not None:
                    asserts.Eq(
                        paddings.shape[1],
                        key_len,
                        "paddings.shape[1]",
                        "key_vec.shape[1]",
                        where=self.path,
                    )
            mask = (tf.cast(paddings, logits_dtype) < 0.5)[:, tf.newaxis, tf.newaxis, :]
        if p.causal:
            t = tf.shape(query_vec)[1]
            causal = tf.linalg.band_part(tf.ones([t, t], tf.bool), -1, 0)
            mask = causal if mask is None else tf.logical_and(mask, causal)
        if mask is not None:
            large_negative = tf.constant(LargeNegative(logits_dtype), logits_dtype)
            logits = tf.where(mask, logits, large_negative)
        probs = tf.cast(tf.nn.softmax(logits, axis=-1), dtype)

        dropped = self.atten_dropout.FProp(theta.atten_dropout, probs)
        context = tf.einsum("bnts,bsnh->btnh", dropped, v)
        n = p.num_heads
        w_post = tf.reshape(tf.cast(theta.w_post, dtype), [n, -1, p.input_dims])
        encoded = tf.einsum("btnh,nhd->btd", context, w_post)
        if p.use_bias:
            encoded += tf.cast(theta.b_post, dtype)
        return encoded, probs

    @classmethod
    def NumParams(cls, p: hyperparams.Params) -> int:
        d, h = p.input_dims, cls._HiddenDims(p)
        return 4 * d * h + ((3 * h + d) if p.use_bias else 0)

    @classmethod
    def FPropMeta(
        cls,
        p: hyperparams.Params,
        query_shape: Any,
        key_shape: Any = None,
        value_shape: Any = None,
        paddings_shape: Any = None,
    ) -> NestedMap:
        """Shapes and FLOPs: four projections and two [t, s] products per example.

        FLOPs = 2*b*(t*d*h [query] + 2*s*d*h [key, value] + t*h*d [post]
        + 2*t*s*h [scores, context]); softmax, biases and masking are not counted.
        """
        cls._Validate(p, p.name or cls.__name__)
        query_shape = base_layer.ToShape(query_shape)
        key_shape = query_shape if key_shape is None else base_layer.ToShape(key_shape)
        asserts.Eq(query_shape.rank, 3, "query_shape.rank", where=p.name)
        asserts.Eq(key_shape.rank, 3, "key_shape.rank", where=p.name)
        b, t, _ = query_shape.as_list()
        s = key_shape[1]
        if None in (b, t, s):
            raise ValueError(
                f"{p.name}: FPropMeta needs known batch and time dims, received "
                f"query_shape={query_shape}, key_shape={key_shape}"
            )
        d, h = p.input_dims, cls._HiddenDims(p)
        flops = 2 * b * (t * d * h + 2 * s * d * h + t * h * d + 2 * t * s * h)
        out_shapes = (
            tf.TensorShape([b, t, d]),
            tf.TensorShape([b, p.num_heads, t, s]),
        )
        return base_layer.Meta(out_shapes, flops, cls.NumParams(p))
