"""Token embeddings: a lookup table whose weight can also serve as a tied softmax.

emb = EmbeddingLayer.Params().Set(name='emb', vocab_size=32000, embedding_dim=512)
layer = emb.Instantiate()
x = layer(ids)                            # ids [batch, time] -> [batch, time, 512]
logits = layer.Logits(layer.theta, h)     # h [batch, time, 512] -> [batch, time, 32000]
out = softmax.CrossEntropy(logits, class_ids=labels)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import tensorflow as tf

from lingpipe import asserts, base_layer, hyperparams
from lingpipe.layers import linear
from lingpipe.nested_map import NestedMap

__all__ = [
    "EmbeddingLayer",
]


class EmbeddingLayer(base_layer.BaseLayer):
    """Looks up rows of `emb` [vocab_size, embedding_dim] by id.

    `Logits` multiplies by the transpose of the same table, so a language model
    can tie its input embedding and its softmax weight.
    """

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("vocab_size", 0, "Number of rows of the table: ids are in [0, vocab_size).")
        p.Define("embedding_dim", 0, "Size of each embedding vector.")
        p.Define(
            "scale_sqrt_depth",
            False,
            "If True, multiply the looked-up vectors by sqrt(embedding_dim) (as in Transformer).",
        )
        return p

    @classmethod
    def _CheckParams(cls, p: hyperparams.Params, where: str) -> None:
        asserts.Positive(p.vocab_size, "vocab_size", where=where)
        asserts.Positive(p.embedding_dim, "embedding_dim", where=where)
        if not isinstance(p.scale_sqrt_depth, bool):
            raise ValueError(
                f"{where}: expected scale_sqrt_depth to be a bool, "
                f"received scale_sqrt_depth={p.scale_sqrt_depth!r}"
            )

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        self._CheckParams(p, self.path)
        init = p.params_init
        # Xavier over [vocab, dim] shrinks with the vocabulary; a lookup table wants
        # unit-ish rows instead, so the untouched default becomes N(0, 1/dim).
        if init == base_layer.WeightInit.Xavier(1.0):
            init = base_layer.WeightInit.Gaussian(1.0 / math.sqrt(p.embedding_dim))
        self.CreateVariable(
            "emb", base_layer.WeightParams([p.vocab_size, p.embedding_dim], init=init)
        )

    def FProp(self, theta: NestedMap, ids: tf.Tensor) -> tf.Tensor:
        """ids: int [...], each in [0, vocab_size) -> [..., embedding_dim].

        Out-of-range ids raise on CPU; on accelerators tf.gather gives zeros instead.
        """
        p = self.params
        ids = tf.convert_to_tensor(ids)
        if not ids.dtype.is_integer:
            raise ValueError(
                f"{self.path}: expected integer ids, received ids.dtype={ids.dtype.name}; "
                f"cast them with tf.cast(ids, tf.int32)"
            )
        emb = tf.cast(theta.emb, self.fprop_dtype)
        outputs = tf.gather(emb, ids)
        if p.scale_sqrt_depth:
            outputs *= tf.cast(math.sqrt(p.embedding_dim), self.fprop_dtype)
        return outputs

    def Logits(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
        """inputs: [..., embedding_dim] -> [..., vocab_size] = inputs @ emb^T."""
        p = self.params
        inputs = tf.convert_to_tensor(inputs, dtype=self.fprop_dtype)
        linear.CheckLastDim(inputs, p.embedding_dim, "embedding_dim", self.path)
        emb = tf.cast(theta.emb, self.fprop_dtype)
        return linear.MatMulLastDim(inputs, emb, transpose_w=True)

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, ids_shape: Any) -> NestedMap:
        """ids_shape [...] -> out_shapes ([..., embedding_dim],).

        A gather does no arithmetic; scaling costs one multiply per output element.
        """
        cls._CheckParams(p, p.name)
        shape = base_layer.ToShape(ids_shape)
        if shape.rank is None:
            raise ValueError(f"{p.name}: FPropMeta needs the rank of ids, received {shape}")
        out_shape = shape.concatenate([p.embedding_dim])
        flops = 0
        if p.scale_sqrt_depth:
            if not shape.is_fully_defined():
                raise ValueError(
                    f"{p.name}: FPropMeta needs every ids dim known to count FLOPs, "
                    f"received {shape}"
                )
            flops = int(np.prod(out_shape.as_list(), dtype=np.int64))
        return base_layer.Meta(out_shape, flops, p.vocab_size * p.embedding_dim)
