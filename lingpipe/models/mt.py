"""A GPipe Transformer encoder-decoder for translation, as in the GPipe paper's NMT model.

The whole model is ONE pipeline. Its cells pass a NestedMap state along:

    source embedding  {src_ids, src_paddings, tgt_*}       -> + src_x  (- src_ids)
    encoder cell x E  src_x = layer(src_x, src_paddings)      (last: + final LayerNorm)
    target embedding  {tgt_ids, ...}                        -> + tgt_x  (- tgt_ids)
    decoder cell x D  tgt_x = layer(tgt_x, tgt_paddings, aux=src_x, aux_paddings=src_paddings)
    softmax cell      LayerNorm, softmax  -> NestedMap(xent, weights, argmax), each [b, T]

so the source (and, once encoded, the encoder output) rides through the decoder's
stages to every cross-attention. Embeddings are token embedding * sqrt(d) plus a
sinusoidal position signal (no length limit, no parameters). Source and target
embeddings are separate tables.

`TransformerEncDec.Decode` is greedy decoding with the same cells run one after
another outside the pipeline, recomputing the decoder over the whole prefix at each
step (O(T^2): meant for small models and evaluation).

The cells themselves are in `mt_cells`.
"""

from __future__ import annotations

import tensorflow as tf

from lingpipe import asserts, base_layer, hyperparams
from lingpipe.layers import transformer
from lingpipe.models import base_task, mt_cells
from lingpipe.nested_map import NestedMap

__all__ = [
    "ExactMatch",
    "TransformerEncDec",
]


def ExactMatch(decoded: tf.Tensor, labels: tf.Tensor, weights: tf.Tensor) -> tuple:
    """(fraction of sequences whose decoded tokens equal labels wherever weights > 0,
    number of sequences with any weight). decoded, labels: int [b, T]; weights [b, T].

    labels end with EOS, so a match means the same tokens up to and including EOS.
    """
    asserts.Eq(decoded.shape.as_list(), labels.shape.as_list(), "decoded.shape", "labels.shape")
    counted = tf.cast(weights, tf.float32) > 0
    same = tf.logical_or(tf.equal(tf.cast(decoded, labels.dtype), labels), ~counted)
    real = tf.cast(tf.reduce_any(counted, axis=1), tf.float32)
    matches = tf.reduce_sum(tf.cast(tf.reduce_all(same, axis=1), tf.float32) * real)
    num = tf.reduce_sum(real)
    return matches / tf.maximum(num, 1.0), num


class TransformerEncDec(base_task.BaseTask):
    """Transformer encoder-decoder whose cells run as one GPipe pipeline.

    Input batches: NestedMap(src=NestedMap(ids [b, S], paddings [b, S]),
    tgt=NestedMap(ids [b, T] (BOS + target), labels [b, T] (target + EOS),
    paddings [b, T], weights [b, T])), as `inputs.seq2seq.Seq2SeqInput` makes them.
    Metrics: loss (weighted mean per-token xent), token_accuracy, and in eval (if
    `eval_exact_match`) exact_match of greedy decoding.
    """

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("vocab_size", 16, "Vocabulary size, shared by source and target ids.")
        p.Define("model_dims", 32, "Model dimension d.")
        p.Define("num_encoder_layers", 2, "Encoder Transformer layers (one cell each).")
        p.Define("num_decoder_layers", 2, "Decoder Transformer layers (one cell each).")
        p.Define("num_heads", 2, "Attention heads; must divide model_dims.")
        p.Define("hidden_dims", 64, "Inner size of each feed-forward block.")
        p.Define("dropout_prob", 0.0, "Dropout on embeddings and residual branches.")
        p.Define("atten_dropout_prob", 0.0, "Dropout on attention probabilities.")
        p.Define("label_smoothing", 0.0, "Label smoothing of the training xent, in [0, 1).")
        p.Define("bos_id", 1, "Id that starts every target (the first decoder input).")
        p.Define("eos_id", 2, "Id that ends every target; decoding pads with 0 after it.")
        p.Define("eval_exact_match", True, "In eval, also greedy-decode and report exact_match.")
        base_task.DefinePipelineParams(p)
        return p

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        for name in ("vocab_size", "model_dims", "num_encoder_layers", "num_decoder_layers"):
            asserts.Positive(p.Get(name), name, where=self.path)
        asserts.Positive(p.num_heads, "num_heads", where=self.path)
        asserts.DivisibleBy(
            p.model_dims,
            p.num_heads,
            "model_dims",
            "num_heads",
            where=self.path,
            hint="each head gets model_dims // num_heads dimensions",
        )
        for name in ("bos_id", "eos_id"):
            if not 0 <= p.Get(name) < p.vocab_size:
                raise ValueError(
                    f"{self.path}: expected 0 <= {name} < vocab_size, received "
                    f"{name}={p.Get(name)}, vocab_size={p.vocab_size}"
                )
        input_vocab = getattr(p.input, "vocab_size", None) if p.input is not None else None
        if input_vocab is not None and input_vocab > p.vocab_size:
            raise ValueError(
                f"{self.path}: vocab_size={p.vocab_size} is smaller than the input's "
                f"vocab_size={input_vocab}; ids up to {input_vocab - 1} would be out of "
                f"range: set vocab_size >= {input_vocab}"
            )
        self.CreateChild("pipeline", self.PipelineParams(p))

    @classmethod
    def PipelineParams(cls, p: hyperparams.Params) -> hyperparams.InstantiableParams:
        """The params of the `pipeline` child (cells, stages, input shapes), building nothing."""
        return base_task.PipelineLayerParams(p, cls._CellParams(p), cls._InputShapes(p))

    @classmethod
    def _CellParams(cls, p: hyperparams.Params) -> list:
        layer = transformer.TransformerLayer.Params().Set(
            input_dims=p.model_dims,
            num_heads=p.num_heads,
            hidden_dims=p.hidden_dims,
            dropout_prob=p.dropout_prob,
            atten_dropout_prob=p.atten_dropout_prob,
        )
        emb = mt_cells.EmbeddingCell.Params().Set(
            vocab_size=p.vocab_size, model_dims=p.model_dims, dropout_prob=p.dropout_prob
        )
        num_enc = p.num_encoder_layers
        enc = [
            mt_cells.EncoderCell.Params().Set(layer=layer.Copy(), final_layer_norm=i == num_enc - 1)
            for i in range(num_enc)
        ]
        dec_layer = layer.Copy().Set(causal=True, has_aux_atten=True)
        dec = [
            mt_cells.DecoderCell.Params().Set(layer=dec_layer) for _ in range(p.num_decoder_layers)
        ]
        out = mt_cells.SoftmaxCell.Params().Set(
            vocab_size=p.vocab_size, model_dims=p.model_dims, label_smoothing=p.label_smoothing
        )
        tgt_emb = emb.Copy().Set(ids_key="tgt_ids", output_key="tgt_x")
        return [emb, *enc, tgt_emb, *dec, out]

    @classmethod
    def _InputShapes(cls, p: hyperparams.Params) -> tuple | None:
        """The pipeline input's shapes from Seq2SeqInput-like params, else None.

        S = p.input.max_len, T = S + 1, batch = p.input.batch_size. The pipeline needs
        them for partition 'flops', 'params' and 'profile' and its PartitionReport.
        """
        batch = getattr(p.input, "batch_size", None) if p.input is not None else None
        src_len = getattr(p.input, "max_len", None) if p.input is not None else None
        if not isinstance(batch, int) or not isinstance(src_len, int):
            return None
        src, tgt = [batch, src_len], [batch, src_len + 1]
        return (
            NestedMap(
                src_ids=src,
                src_paddings=src,
                tgt_ids=tgt,
                tgt_labels=tgt,
                tgt_paddings=tgt,
                tgt_weights=tgt,
            ),
        )

    def _InputState(self, input_batch: NestedMap) -> NestedMap:
        src, tgt = input_batch.src, input_batch.tgt
        dtype = self.fprop_dtype
        return NestedMap(
            src_ids=tf.convert_to_tensor(src.ids),
            src_paddings=tf.cast(src.paddings, dtype),
            tgt_ids=tf.convert_to_tensor(tgt.ids),
            tgt_labels=tf.convert_to_tensor(tgt.labels),
            tgt_paddings=tf.cast(tgt.paddings, dtype),
            tgt_weights=tf.cast(tgt.weights, dtype),
        )

    def ComputePredictions(self, theta: NestedMap, input_batch: NestedMap) -> NestedMap:
        """Runs the pipeline: NestedMap(xent, weights, argmax), each [b, T]."""
        return self.pipeline.FProp(theta.pipeline, *self.PipelineInputs(theta, input_batch))

    def PipelineInputs(self, theta: NestedMap, input_batch: NestedMap) -> tuple:
        """(state,): the source and target the encoder and decoder stages read."""
        return (self._InputState(input_batch),)

    def ComputeLoss(
        self, theta: NestedMap, predictions: NestedMap, input_batch: NestedMap
    ) -> NestedMap:
        """loss = sum(xent * weights) / sum(weights); token_accuracy; exact_match in eval."""
        weights = predictions.weights
        total = tf.reduce_sum(weights)
        denom = tf.maximum(total, 1e-9)
        labels = tf.cast(input_batch.tgt.labels, tf.int32)
        correct = tf.cast(tf.equal(predictions.argmax, labels), weights.dtype)
        metrics = NestedMap(
            loss=(tf.reduce_sum(predictions.xent * weights) / denom, total),
            token_accuracy=(tf.reduce_sum(correct * weights) / denom, total),
        )
        if self.do_eval and self.params.eval_exact_match:
            decoded = self.Decode(theta, input_batch)
            metrics.exact_match = ExactMatch(decoded, labels, input_batch.tgt.weights)
        return metrics

    def Decode(
        self, theta: NestedMap, input_batch: NestedMap, max_len: int | None = None
    ) -> tf.Tensor:
        """Greedy decoding: ids int32 [b, max_len] (default max_len: the target length T).

        The cells run one after another on the whole batch in eval mode (no
        pipeline): the encoder once, then the target embedding, decoder and
        softmax over the whole prefix for every new token. Tokens after the first
        EOS are 0 (padding).
        """
        p = self.params
        if max_len is None:
            max_len = int(input_batch.tgt.ids.shape[1])
        asserts.Positive(max_len, "max_len", where=self.path)
        cells = self.pipeline.Cells()
        thetas = [theta.pipeline[f"cell_{i}"] for i in range(len(cells))]
        num_enc = 1 + p.num_encoder_layers
        src = input_batch.src
        with base_layer.EvalMode():
            state = NestedMap(
                src_ids=tf.convert_to_tensor(src.ids),
                src_paddings=tf.cast(src.paddings, self.fprop_dtype),
            )
            for cell, cell_theta in zip(cells[:num_enc], thetas[:num_enc]):
                state = cell.FProp(cell_theta, state)
            batch = tf.shape(state.src_x)[0]
            ids = tf.fill([batch, 1], tf.constant(p.bos_id, tf.int32))
            for t in range(max_len):
                dec = state.Copy()
                dec.tgt_ids = ids
                dec.tgt_paddings = tf.zeros([batch, t + 1], self.fprop_dtype)
                for cell, cell_theta in zip(cells[num_enc:-1], thetas[num_enc:-1]):
                    dec = cell.FProp(cell_theta, dec)
                logits = cells[-1].Logits(thetas[-1], dec)
                next_ids = tf.argmax(logits[:, -1], axis=-1, output_type=tf.int32)
                ids = tf.concat([ids, next_ids[:, tf.newaxis]], axis=1)
        ids = ids[:, 1:]
        after_eos = tf.cumsum(tf.cast(tf.equal(ids, p.eos_id), tf.int32), axis=1, exclusive=True)
        return tf.where(after_eos > 0, tf.zeros_like(ids), ids)
