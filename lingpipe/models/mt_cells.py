"""Pipeline cells of the GPipe Transformer encoder-decoder (`mt.TransformerEncDec`).

Each cell maps the NestedMap state to the next one: `EmbeddingCell` (source or
target ids -> embeddings), `EncoderCell`, `DecoderCell` (cross-attends to the
encoder output carried in the state) and `SoftmaxCell` (per-token xent). The
state's keys and the cell order are described in `mt`.
"""

from __future__ import annotations

import math

import tensorflow as tf

from lingpipe import base_layer, hyperparams
from lingpipe.layers import (
    dropout,
    embedding,
    normalization,
    positions,
    softmax,
    transformer,
)
from lingpipe.nested_map import NestedMap

__all__ = [
    "DecoderCell",
    "EmbeddingCell",
    "EncoderCell",
    "SoftmaxCell",
]


def _Elements(shape: tf.TensorShape) -> int:
    """Elements of a shape for FLOP counts; unknown dimensions count as 1."""
    return math.prod(d or 1 for d in tf.TensorShape(shape).as_list())


class EmbeddingCell(base_layer.BaseLayer):
    """state[ids_key] int [b, t] -> state[output_key] [b, t, d]; drops state[ids_key]."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("vocab_size", 0, "Rows of the embedding table.")
        p.Define("model_dims", 0, "Embedding size (the model dimension).")
        p.Define("dropout_prob", 0.0, "Dropout on the embeddings plus positions.")
        p.Define("ids_key", "src_ids", "State key of the ids [b, t] to embed.")
        p.Define("output_key", "src_x", "State key of the embeddings [b, t, d] it writes.")
        return p

    @classmethod
    def _ChildParams(cls, p: hyperparams.Params) -> NestedMap:
        return NestedMap(
            emb=embedding.EmbeddingLayer.Params().Set(
                name="emb",
                vocab_size=p.vocab_size,
                embedding_dim=p.model_dims,
                scale_sqrt_depth=True,
            ),
            dropout=dropout.DropoutLayer.Params().Set(name="dropout", keep_prob=1 - p.dropout_prob),
        )

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        for name, child_p in self._ChildParams(self.params).items():
            self.CreateChild(name, child_p)

    def FProp(self, theta: NestedMap, state: NestedMap) -> NestedMap:
        """state[ids_key]: int [b, t] -> the state with state[output_key]: [b, t, d]."""
        p = self.params
        x = self.emb.FProp(theta.emb, state[p.ids_key])
        x += positions.Sinusoidal(tf.shape(x)[1], p.model_dims, x.dtype)[tf.newaxis]
        out = state.Copy()
        del out[p.ids_key]
        out[p.output_key] = self.dropout.FProp(theta.dropout, x)
        return out

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, state: NestedMap) -> NestedMap:
        children = cls._ChildParams(p)
        emb = children.emb.cls.FPropMeta(children.emb, state[p.ids_key])
        x_shape = emb.out_shapes[0]
        drop = children.dropout.cls.FPropMeta(children.dropout, x_shape)
        out = state.Copy()
        del out[p.ids_key]
        out[p.output_key] = x_shape
        return base_layer.Meta(out, emb.flops + drop.flops + _Elements(x_shape), emb.num_params)


class EncoderCell(base_layer.BaseLayer):
    """state.src_x = layer(state.src_x, state.src_paddings) (+ a final LayerNorm if asked)."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("layer", transformer.TransformerLayer.Params(), "Non-causal Transformer layer.")
        p.Define("final_layer_norm", False, "LayerNorm the output (the encoder's last cell).")
        return p

    @classmethod
    def _ChildParams(cls, p: hyperparams.Params) -> NestedMap:
        children = NestedMap(layer=p.layer.Copy().Set(name="layer"))
        if p.final_layer_norm:
            children.final_ln = normalization.LayerNorm.Params().Set(
                name="final_ln", input_dims=p.layer.input_dims
            )
        return children

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        for name, child_p in self._ChildParams(self.params).items():
            self.CreateChild(name, child_p)

    def FProp(self, theta: NestedMap, state: NestedMap) -> NestedMap:
        """state.src_x: [b, S, d], state.src_paddings: [b, S] -> the state, src_x updated."""
        x = self.layer.FProp(theta.layer, state.src_x, paddings=state.src_paddings)
        if self.params.final_layer_norm:
            x = self.final_ln.FProp(theta.final_ln, x)
        out = state.Copy()
        out.src_x = x
        return out

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, state: NestedMap) -> NestedMap:
        metas = [p.layer.cls.FPropMeta(p.layer, state.src_x, state.src_paddings)]
        children = cls._ChildParams(p)
        if p.final_layer_norm:
            metas.append(children.final_ln.cls.FPropMeta(children.final_ln, state.src_x))
        flops, num_params = sum(m.flops for m in metas), sum(m.num_params for m in metas)
        return base_layer.Meta(state.Copy(), flops, num_params)


class DecoderCell(base_layer.BaseLayer):
    """state.tgt_x = layer(tgt_x, tgt_paddings, aux_vecs=src_x, aux_paddings=src_paddings)."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define(
            "layer",
            transformer.TransformerLayer.Params().Set(causal=True, has_aux_atten=True),
            "Causal Transformer layer with cross-attention to the encoder output.",
        )
        return p

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        self.CreateChild("layer", self.params.layer.Copy().Set(name="layer"))

    def FProp(self, theta: NestedMap, state: NestedMap) -> NestedMap:
        """state.tgt_x: [b, T, d], tgt_paddings [b, T], src_x [b, S, d], src_paddings [b, S]."""
        out = state.Copy()
        out.tgt_x = self.layer.FProp(
            theta.layer,
            state.tgt_x,
            paddings=state.tgt_paddings,
            aux_vecs=state.src_x,
            aux_paddings=state.src_paddings,
        )
        return out

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, state: NestedMap) -> NestedMap:
        meta = p.layer.cls.FPropMeta(
            p.layer, state.tgt_x, state.tgt_paddings, state.src_x, state.src_paddings
        )
        return base_layer.Meta(state.Copy(), meta.flops, meta.num_params)


class SoftmaxCell(base_layer.BaseLayer):
    """Final LayerNorm and softmax: per-token xent [b, T] against state.tgt_labels."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("vocab_size", 0, "Number of classes.")
        p.Define("model_dims", 0, "Size of state.tgt_x's last dimension.")
        p.Define("label_smoothing", 0.0, "Label smoothing of the cross-entropy, in [0, 1).")
        return p

    @classmethod
    def _ChildParams(cls, p: hyperparams.Params) -> NestedMap:
        return NestedMap(
            final_ln=normalization.LayerNorm.Params().Set(name="final_ln", input_dims=p.model_dims),
            softmax=softmax.SimpleFullSoftmax.Params().Set(
                name="softmax",
                input_dims=p.model_dims,
                num_classes=p.vocab_size,
                label_smoothing=p.label_smoothing,
            ),
        )

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        for name, child_p in self._ChildParams(self.params).items():
            self.CreateChild(name, child_p)

    def Logits(self, theta: NestedMap, state: NestedMap) -> tf.Tensor:
        """state.tgt_x: [b, T, d] -> logits [b, T, vocab_size]."""
        normed = self.final_ln.FProp(theta.final_ln, state.tgt_x)
        return self.softmax.Logits(theta.softmax, normed)

    def FProp(self, theta: NestedMap, state: NestedMap) -> NestedMap:
        """Returns NestedMap(xent [b, T], weights [b, T], argmax int32 [b, T])."""
        normed = self.final_ln.FProp(theta.final_ln, state.tgt_x)
        out = self.softmax.FProp(
            theta.softmax, normed, class_ids=state.tgt_labels, class_weights=state.tgt_weights
        )
        weights = tf.cast(state.tgt_weights, out.per_example_xent.dtype)
        return NestedMap(xent=out.per_example_xent, weights=weights, argmax=out.per_example_argmax)

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, state: NestedMap) -> NestedMap:
        children = cls._ChildParams(p)
        ln = children.final_ln.cls.FPropMeta(children.final_ln, state.tgt_x)
        sm = children.softmax.cls.FPropMeta(children.softmax, state.tgt_x)
        token_shape = state.tgt_x[:-1]
        out = NestedMap(xent=token_shape, weights=token_shape, argmax=token_shape)
        return base_layer.Meta(out, ln.flops + sm.flops, ln.num_params + sm.num_params)
