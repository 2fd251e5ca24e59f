"""A GPipe Transformer language model: embedding, causal Transformer cells, softmax.

The whole network is ONE PipeliningLayer (`pipeline`) whose cells pass a NestedMap
state to one another:

    embedding cell   ids [b, t]  -> x [b, t, d] = emb[ids] * sqrt(d) + positions
    transformer cell x           -> x (pre-norm, causal self-attention)   x num_layers
    softmax cell     x           -> xent, nll, correct, weights  (each [b, t])

Positions are sinusoidal (Lingvo's layout: the sines of all timescales, then their
cosines), so they add no weights; `max_len` only bounds the sequences accepted.

Tied embeddings (`tie_embeddings=True`): the task owns ONE variable `emb`
[vocab_size, model_dims] on the first stage's device. It enters the pipeline as an
unbatched leaf of the state, `state.tied_emb` [1, vocab_size, model_dims]: the
leading axis of 1 keeps it from ever being taken for a batched leaf (whatever the
batch size), and its key sorts after `ids`, the leaf the pipeline reads the batch
size from. The pipeline hands it whole to every micro-batch; the embedding cell
looks ids up in it, the Transformer cells carry it along, and the softmax cell
computes logits = x @ emb^T. Its gradient is therefore the sum of both uses over
all micro-batches, gathered by the pipeline's own backward.

Caveat: the whole table travels across every stage boundary in each step (and its
gradient back), vocab_size x model_dims values per boundary and micro-batch. With a
large vocabulary and many stages, untied embeddings (each end owns its table) move
much less.
"""

from __future__ import annotations

import math

import tensorflow as tf

from lingpipe import asserts, base_layer, hyperparams
from lingpipe.inputs import text_lm
from lingpipe.layers import (
    dropout,
    embedding,
    linear,
    normalization,
    positions,
    softmax,
    transformer,
)
from lingpipe.models import base_task
from lingpipe.nested_map import NestedMap

__all__ = [
    "LmEmbeddingCell",
    "LmSoftmaxCell",
    "LmTransformerCell",
    "TransformerLm",
]

# Log-softmax and cross-entropy per logit, as layers/softmax.py counts them.
_XENT_FLOPS_PER_LOGIT = 5


class LmEmbeddingCell(base_layer.BaseLayer):
    """First cell: NestedMap(ids, labels, paddings, weights[, tied_emb]) -> the state with x."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("vocab_size", 0, "Number of token ids.")
        p.Define("model_dims", 0, "Size of the embeddings.")
        p.Define("max_len", 0, "Longest sequence accepted (positions are sinusoidal).")
        p.Define(
            "tie_embeddings", False, "If True, look up in state.tied_emb instead of own table."
        )
        p.Define("dropout_prob", 0.0, "Dropout probability on the embeddings plus positions.")
        return p

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        asserts.Positive(p.max_len, "max_len", where=self.path)
        if not p.tie_embeddings:
            self.CreateChild(
                "emb",
                embedding.EmbeddingLayer.Params().Set(
                    vocab_size=p.vocab_size, embedding_dim=p.model_dims, scale_sqrt_depth=True
                ),
            )
        self.CreateChild("dropout", dropout.DropoutLayer.Params().Set(keep_prob=1 - p.dropout_prob))

    def FProp(self, theta: NestedMap, state: NestedMap) -> NestedMap:
        """state: ids int [b, t], labels int [b, t], paddings [b, t], weights [b, t] and,
        if tied, tied_emb [1, vocab_size, model_dims]. Returns the state without ids, with
        x [b, t, model_dims]."""
        p = self.params
        length = state.ids.shape[1]
        if length is not None and length > p.max_len:
            raise ValueError(
                f"{self.path}: expected sequences of at most max_len={p.max_len} tokens, "
                f"received ids.shape={state.ids.shape.as_list()}; raise max_len"
            )
        if p.tie_embeddings:
            x = tf.gather(tf.cast(state.tied_emb[0], self.fprop_dtype), state.ids)
            x *= tf.cast(math.sqrt(p.model_dims), self.fprop_dtype)
        else:
            x = self.emb.FProp(theta.emb, state.ids)
        x += positions.Sinusoidal(tf.shape(state.ids)[1], p.model_dims, self.fprop_dtype)
        out = NestedMap({k: v for k, v in state.items() if k != "ids"})
        out.x = self.dropout.FProp(theta.dropout, x)
        return out

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, state: NestedMap) -> NestedMap:
        out = NestedMap({k: v for k, v in state.items() if k != "ids"})
        out.x = base_layer.ToShape(state.ids).concatenate([p.model_dims])
        flops = 3 * out.x.num_elements()  # scale, add positions, dropout
        return base_layer.Meta(out, flops, 0 if p.tie_embeddings else p.vocab_size * p.model_dims)


class LmTransformerCell(base_layer.BaseLayer):
    """A Transformer layer on state.x with state.paddings; the rest of the state passes."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("layer", transformer.TransformerLayer.Params(), "The Transformer layer.")
        return p

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        self.CreateChild("layer", self.params.layer)

    def FProp(self, theta: NestedMap, state: NestedMap) -> NestedMap:
        """state.x: [b, t, model_dims], state.paddings: [b, t] -> the state, new x."""
        out = state.Copy()
        out.x = self.layer.FProp(theta.layer, state.x, paddings=state.paddings)
        return out

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, state: NestedMap) -> NestedMap:
        meta = p.layer.cls.FPropMeta(p.layer, state.x, state.paddings)
        return base_layer.Meta(state.Copy(), meta.flops, meta.num_params)


class LmSoftmaxCell(base_layer.BaseLayer):
    """Last cell: final LayerNorm and softmax -> per-token results, all [b, t]."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("vocab_size", 0, "Number of classes.")
        p.Define("model_dims", 0, "Size of state.x's last dimension.")
        p.Define(
            "tie_embeddings", False, "If True, logits = x @ state.tied_emb^T (no own weights)."
        )
        p.Define("label_smoothing", 0.0, "Label smoothing of the training cross-entropy.")
        return p

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        softmax.CheckLabelSmoothing(p.label_smoothing, self.path)
        self.CreateChild("final_ln", normalization.LayerNorm.Params().Set(input_dims=p.model_dims))
        if not p.tie_embeddings:
            self.CreateChild(
                "softmax",
                softmax.SimpleFullSoftmax.Params().Set(
                    input_dims=p.model_dims, num_classes=p.vocab_size
                ),
            )

    def FProp(self, theta: NestedMap, state: NestedMap) -> NestedMap:
        """Returns NestedMap(xent (label-smoothed), nll (log-perplexity per token),
        correct (1.0 where argmax == label), weights), each [b, t]; a state without
        labels (serving) gives NestedMap(logits [b, t, vocab_size])."""
        p = self.params
        x = self.final_ln.FProp(theta.final_ln, state.x)
        if p.tie_embeddings:
            table = tf.cast(state.tied_emb[0], self.fprop_dtype)
            logits = linear.MatMulLastDim(x, table, transpose_w=True)
        else:
            logits = self.softmax.Logits(theta.softmax, x)
        if "labels" not in state:
            return NestedMap(logits=logits)
        out = softmax.CrossEntropy(
            logits,
            class_ids=state.labels,
            class_weights=state.weights,
            label_smoothing=p.label_smoothing,
            where=self.path,
        )
        nll = out.per_example_xent
        if p.label_smoothing:
            nll = -tf.gather(out.log_probs, state.labels, batch_dims=2)
        correct = tf.cast(tf.equal(out.per_example_argmax, state.labels), nll.dtype)
        weights = tf.cast(state.weights, nll.dtype)
        return NestedMap(xent=out.per_example_xent, nll=nll, correct=correct, weights=weights)

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, state: NestedMap) -> NestedMap:
        shape = base_layer.ToShape(state.labels)
        tokens = shape.num_elements()
        logits = tokens * p.vocab_size
        flops = (
            2 * logits * p.model_dims + _XENT_FLOPS_PER_LOGIT * logits + 8 * tokens * p.model_dims
        )
        num_params = 2 * p.model_dims
        if not p.tie_embeddings:
            num_params += (p.model_dims + 1) * p.vocab_size
        out = NestedMap(xent=shape, nll=shape, correct=shape, weights=shape)
        return base_layer.Meta(out, flops, num_params)


class TransformerLm(base_task.BaseTask):
    """A decoder-only Transformer language model, as one GPipe pipeline (see module doc)."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("vocab_size", 259, "Number of token ids (259: TextLmInput's bytes).")
        p.Define("model_dims", 64, "Model (embedding) dimension.")
        p.Define("num_layers", 2, "Number of Transformer layers.")
        p.Define("num_heads", 2, "Attention heads; must divide model_dims.")
        p.Define("hidden_dims", 256, "Inner size of each feed-forward block.")
        p.Define("dropout_prob", 0.0, "Dropout on the embeddings and every residual branch.")
        p.Define("label_smoothing", 0.0, "Label smoothing of the training loss.")
        p.Define("tie_embeddings", False, "Share one [vocab_size, model_dims] table in and out.")
        p.Define("max_len", 1024, "Longest sequence accepted (positions are sinusoidal).")
        base_task.DefinePipelineParams(p)
        return p

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        for name in ("vocab_size", "model_dims", "num_layers", "num_heads", "hidden_dims"):
            asserts.Positive(p.Get(name), name, where=self.path)
        if p.model_dims % p.num_heads:
            raise ValueError(
                f"{self.path}: expected model_dims divisible by num_heads, received "
                f"model_dims={p.model_dims}, num_heads={p.num_heads}"
            )
        if p.input is not None and "vocab_size" in p.input and p.input.vocab_size > p.vocab_size:
            raise ValueError(
                f"{self.path}: expected vocab_size >= the input's vocab_size, received "
                f"vocab_size={p.vocab_size}, input.vocab_size={p.input.vocab_size}"
            )
        self.CreateChild("pipeline", self.PipelineParams(p, self.path))
        if p.tie_embeddings:
            init = base_layer.WeightInit.Gaussian(1.0 / math.sqrt(p.model_dims))
            with tf.device(self.pipeline.devices[0]):
                self.CreateVariable(
                    "emb", base_layer.WeightParams([p.vocab_size, p.model_dims], init=init)
                )

    @classmethod
    def PipelineParams(
        cls, p: hyperparams.Params, where: str = ""
    ) -> hyperparams.InstantiableParams:
        """The params of the `pipeline` child that task params `p` build (nothing built)."""
        tied = p.tie_embeddings
        layer = transformer.TransformerLayer.Params().Set(
            input_dims=p.model_dims,
            num_heads=p.num_heads,
            hidden_dims=p.hidden_dims,
            causal=True,
            dropout_prob=p.dropout_prob,
        )
        cells = [
            LmEmbeddingCell.Params().Set(
                vocab_size=p.vocab_size,
                model_dims=p.model_dims,
                max_len=p.max_len,
                tie_embeddings=tied,
                dropout_prob=p.dropout_prob,
            )
        ]
        cells += [LmTransformerCell.Params().Set(layer=layer.Copy()) for _ in range(p.num_layers)]
        cells.append(
            LmSoftmaxCell.Params().Set(
                vocab_size=p.vocab_size,
                model_dims=p.model_dims,
                tie_embeddings=tied,
                label_smoothing=p.label_smoothing,
            )
        )
        return base_task.PipelineLayerParams(p, cells, cls.InputShapes(p, where))

    @classmethod
    def InputShapes(cls, p: hyperparams.Params, where: str = "") -> tuple | None:
        """The pipeline's input shapes from the input params (batch_size, seq_len).

        They let the pipeline cut by cost and report FLOPs and boundary bytes. Without
        them: None for partition 'uniform' or explicit counts, else a ValueError.
        """
        known = p.input is not None and "seq_len" in p.input and "batch_size" in p.input
        if not known:
            if not isinstance(p.partition, str) or p.partition == "uniform":
                return None
            raise ValueError(
                f"{where or p.name}: partition={p.partition!r} needs the batch's shape; set input "
                f"params with batch_size and seq_len, or use partition='uniform'"
            )
        shape = tf.TensorShape([p.input.batch_size, p.input.seq_len])
        state = NestedMap(ids=shape, labels=shape, paddings=shape, weights=shape)
        if p.tie_embeddings:
            state.tied_emb = tf.TensorShape([1, p.vocab_size, p.model_dims])
        return (state,)

    def ComputePredictions(self, theta: NestedMap, input_batch: NestedMap) -> NestedMap:
        """input_batch: ids, labels (int [b, t]), paddings, weights ([b, t]).

        Returns NestedMap(xent, nll, correct, weights), each [b, t].
        """
        return self.pipeline.FProp(theta.pipeline, *self.PipelineInputs(theta, input_batch))

    def ServingInputSpecs(self) -> dict[str, tf.TensorSpec]:
        """What a served model takes (lingpipe.export): ids int32 [b, t], any b and
        t <= max_len, padded past each sequence's end with text_lm.PAD_ID (0)."""
        return {"ids": tf.TensorSpec([None, None], tf.int32, name="ids")}

    def Serve(self, theta: NestedMap, ids: tf.Tensor) -> dict[str, tf.Tensor]:
        """Next-token predictions of ids [b, t] (paddings where ids == PAD_ID):
        {logits: float32 [b, t, vocab_size], predictions: int32 [b, t], the most
        likely next id}."""
        # The pipeline splits a batch into num_micro_batches: a smaller batch gets
        # padded rows, dropped from the results.
        batch = tf.shape(ids)[0]
        ids = tf.pad(ids, [[0, tf.maximum(self.params.num_micro_batches - batch, 0)], [0, 0]])
        paddings = tf.cast(tf.equal(ids, text_lm.PAD_ID), self.fprop_dtype)
        state = NestedMap(ids=ids, paddings=paddings)
        if self.params.tie_embeddings:
            with tf.device(self.pipeline.devices[0]):
                state.tied_emb = tf.convert_to_tensor(theta.emb)[tf.newaxis]
        logits = tf.cast(self.pipeline.FProp(theta.pipeline, state).logits[:batch], tf.float32)
        return {"logits": logits, "predictions": tf.argmax(logits, axis=-1, output_type=tf.int32)}

    def PipelineInputs(self, theta: NestedMap, input_batch: NestedMap) -> tuple:
        """(state,): the pipeline's input state (with the tied table, if tied)."""
        state = NestedMap(
            ids=input_batch.ids,
            labels=input_batch.labels,
            paddings=tf.cast(input_batch.paddings, self.fprop_dtype),
            weights=tf.cast(input_batch.weights, self.fprop_dtype),
        )
        if self.params.tie_embeddings:
            with tf.device(self.pipeline.devices[0]):
                state.tied_emb = tf.convert_to_tensor(theta.emb)[tf.newaxis]
        return (state,)

    def ComputeLoss(
        self, theta: NestedMap, predictions: NestedMap, input_batch: NestedMap
    ) -> NestedMap:
        """Weighted means over tokens, each as (value, total weight): `loss` (training
        cross-entropy), `log_pplx` (without label smoothing) and
        `fraction_of_correct_next_step_preds`. Summed in float32 whatever the
        compute dtype: a bfloat16 sum loses the small terms, a float16 one overflows."""
        weights = tf.cast(predictions.weights, tf.float32)
        total = tf.reduce_sum(weights)
        denom = tf.maximum(total, 1e-8)

        def Mean(values: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            return tf.reduce_sum(tf.cast(values, tf.float32) * weights) / denom, total

        return NestedMap(
            loss=Mean(predictions.xent),
            log_pplx=Mean(predictions.nll),
            fraction_of_correct_next_step_preds=Mean(predictions.correct),
        )
