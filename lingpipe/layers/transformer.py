"""A pre-norm Transformer layer: self-attention, optional cross-attention, feed-forward."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from lingpipe import asserts, base_layer, hyperparams, seeds
from lingpipe.layers import activations, attention, dropout, linear, normalization
from lingpipe.nested_map import NestedMap

__all__ = [
    "TransformerLayer",
]


class TransformerLayer(base_layer.BaseLayer):
    """One pre-norm residual Transformer layer (an encoder layer, or a decoder one).

        x = inputs + drop(self_atten(ln(inputs), paddings))
        x = x + drop(aux_atten(ln(x), aux_vecs, aux_paddings))   # if has_aux_atten
        x = x + drop(ffn_out(ffn_in(ln(x))))

    Outputs at padded query positions are computed like any other (not zeroed):
    callers mask them out of the loss.
    """

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("input_dims", 0, "Model dimension: last dim of inputs, outputs and aux_vecs.")
        p.Define("num_heads", 1, "Number of attention heads; must divide input_dims.")
        p.Define("hidden_dims", 0, "Inner size of the feed-forward block.")
        p.Define("activation", "RELU", "Activation of the feed-forward block's first layer.")
        p.Define("causal", False, "If True, self-attention only looks at positions <= t.")
        p.Define("has_aux_atten", False, "If True, cross-attends to aux_vecs (a decoder layer).")
        p.Define("dropout_prob", 0.0, "Dropout probability on each sub-layer's residual branch.")
        p.Define("atten_dropout_prob", 0.0, "Dropout probability on the attention probabilities.")
        p.Define("ln_epsilon", 1e-6, "Epsilon of the layer norms.")
        return p

    @classmethod
    def _CheckParams(cls, p: hyperparams.Params, where: str) -> None:
        asserts.Positive(p.input_dims, "input_dims", where=where)
        asserts.Positive(p.hidden_dims, "hidden_dims", where=where)
        asserts.Positive(p.num_heads, "num_heads", where=where)
        activations.Check(p.activation, where=where)
        if not 0.0 <= p.dropout_prob < 1.0:
            raise ValueError(
                f"{where}: expected 0 <= dropout_prob < 1, received dropout_prob={p.dropout_prob!r}"
            )

    @classmethod
    def _ChildParams(cls, p: hyperparams.Params) -> NestedMap:
        """The params of each child, by child name (shared by __init__ and FPropMeta)."""
        ln = normalization.LayerNorm.Params().Set(input_dims=p.input_dims, epsilon=p.ln_epsilon)
        atten = attention.MultiHeadedAttention.Params().Set(
            input_dims=p.input_dims,
            num_heads=p.num_heads,
            atten_dropout_prob=p.atten_dropout_prob,
        )
        children = NestedMap(self_atten_ln=ln.Copy(), self_atten=atten.Copy().Set(causal=p.causal))
        if p.has_aux_atten:
            children.aux_atten_ln = ln.Copy()
            children.aux_atten = atten.Copy()
        children.ffn_ln = ln.Copy()
        children.ffn_in = linear.ProjectionLayer.Params().Set(
            input_dims=p.input_dims, output_dims=p.hidden_dims, activation=p.activation
        )
        children.ffn_out = linear.ProjectionLayer.Params().Set(
            input_dims=p.hidden_dims, output_dims=p.input_dims, activation="NONE"
        )
        children.residual_dropout = dropout.DropoutLayer.Params().Set(
            keep_prob=1.0 - p.dropout_prob
        )
        for name, child in children.items():
            child.name = name
        return children

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        self._CheckParams(p, self.path)
        for name, child_params in self._ChildParams(p).items():
            self.CreateChild(name, child_params)

    def _Residual(self, theta: NestedMap, x: tf.Tensor, branch: tf.Tensor, site: int) -> tf.Tensor:
        # Each residual site folds its own index into the dropout seed, so the three
        # sites of one layer draw different masks.
        with seeds.StepSeedScope(site):
            return x + self.residual_dropout.FProp(theta.residual_dropout, branch)

    def FProp(
        self,
        theta: NestedMap,
        inputs: tf.Tensor,
        paddings: tf.Tensor | None = None,
        aux_vecs: tf.Tensor | None = None,
        aux_paddings: tf.Tensor | None = None,
    ) -> tf.Tensor:
        """One Transformer layer.

        Args:
          theta: this layer's variables and its children's (NestedMap).
          inputs: [batch, time, input_dims].
          paddings: [batch, time], 1.0 at padded positions (not attended to), or None.
          aux_vecs: [batch, source_time, input_dims], what the cross-attention attends
            to; required iff has_aux_atten.
          aux_paddings: [batch, source_time], 1.0 at padded aux positions, or None.

        Returns:
          outputs: [batch, time, input_dims].
        """
        p = self.params
        inputs = tf.convert_to_tensor(inputs, dtype=self.fprop_dtype)
        linear.CheckLastDim(inputs, p.input_dims, "input_dims", self.path)
        if p.has_aux_atten and aux_vecs is None:
            raise ValueError(
                f"{self.path}: has_aux_atten=True requires aux_vecs "
                f"[batch, source_time, input_dims], received aux_vecs=None"
            )
        if not p.has_aux_atten and (aux_vecs is not None or aux_paddings is not None):
            raise ValueError(
                f"{self.path}: received aux_vecs or aux_paddings but has_aux_atten=False; "
                f"set has_aux_atten=True for a layer with cross-attention"
            )

        normed = self.self_atten_ln.FProp(theta.self_atten_ln, inputs)
        atten_out, _ = self.self_atten.FProp(theta.self_atten, normed, paddings=paddings)
        x = self._Residual(theta, inputs, atten_out, 0)
        if p.has_aux_atten:
            normed = self.aux_atten_ln.FProp(theta.aux_atten_ln, x)
            atten_out, _ = self.aux_atten.FProp(
                theta.aux_atten, normed, key_vec=aux_vecs, paddings=aux_paddings
            )
            x = self._Residual(theta, x, atten_out, 1)
        normed = self.ffn_ln.FProp(theta.ffn_ln, x)
        hidden = self.ffn_in.FProp(theta.ffn_in, normed)
        return self._Residual(theta, x, self.ffn_out.FProp(theta.ffn_out, hidden), 2)

    @classmethod
    def FPropMeta(
        cls,
        p: hyperparams.Params,
        inputs_shape: Any,
        paddings_shape: Any = None,
        aux_vecs_shape: Any = None,
        aux_paddings_shape: Any = None,
    ) -> NestedMap:
        """Sums the children's metas, plus one add per element for each residual."""
        cls._CheckParams(p, p.name)
        shape = base_layer.ToShape(inputs_shape)
        if shape.rank != 3:
            raise ValueError(
                f"{p.name}: FPropMeta expects inputs_shape [batch, time, input_dims], "
                f"received {shape}"
            )
        if p.has_aux_atten and aux_vecs_shape is None:
            raise ValueError(f"{p.name}: has_aux_atten=True requires aux_vecs_shape")
        children = cls._ChildParams(p)
        metas = [
            children.self_atten_ln.cls.FPropMeta(children.self_atten_ln, shape),
            children.self_atten.cls.FPropMeta(children.self_atten, shape),
            children.ffn_ln.cls.FPropMeta(children.ffn_ln, shape),
            children.ffn_in.cls.FPropMeta(children.ffn_in, shape),
            children.ffn_out.cls.FPropMeta(
                children.ffn_out, shape[:-1].concatenate([p.hidden_dims])
            ),
        ]
        drop_meta = children.residual_dropout.cls.FPropMeta(children.residual_dropout, shape)
        num_sites = 2
        if p.has_aux_atten:
            metas.append(children.aux_atten_ln.cls.FPropMeta(children.aux_atten_ln, shape))
            metas.append(
                children.aux_atten.cls.FPropMeta(children.aux_atten, shape, aux_vecs_shape)
            )
            num_sites = 3
        elements = shape.num_elements()
        flops = sum(m.flops for m in metas) + num_sites * (drop_meta.flops + elements)
        num_params = sum(m.num_params for m in metas) + drop_meta.num_params
        return base_layer.Meta(shape, flops, num_params)
