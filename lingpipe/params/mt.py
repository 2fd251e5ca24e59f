"""Translation models: GPipe Transformer encoder-decoders on Seq2SeqInput's generated pairs."""

from __future__ import annotations

from lingpipe import hyperparams, lr_schedules, model_registry, optimizers
from lingpipe.inputs import seq2seq
from lingpipe.models import base_model_params, mt

__all__ = [
    "TransformerEncDecGPipe",
    "TransformerEncDecTiny",
]


@model_registry.RegisterSingleTaskModel
class TransformerEncDecTiny(base_model_params.SingleTaskModelParams):
    """A 2+2-layer, 32-dim encoder-decoder in 2 stages of 2 micro-batches; seconds on CPU.

    Task: reverse sources of 3 to 6 symbols (vocabulary 12: pad, BOS, EOS and 9
    symbols). Greedy exact match on the dev split: 0.45 at step 100, 0.97 at step 200,
    0.98 after its 500 steps (about 20 s on 2 CPU cores, tracing included).
    """

    def Train(self) -> hyperparams.InstantiableParams:
        return seq2seq.Seq2SeqInput.Params().Set(
            name="train_input",
            task="reverse",
            vocab_size=12,
            min_len=3,
            max_len=6,
            batch_size=64,
            split="train",
        )

    def Dev(self) -> hyperparams.InstantiableParams:
        return self.Train().Set(name="dev_input", split="dev", batch_size=250, repeat=False)

    def Test(self) -> hyperparams.InstantiableParams:
        return self.Dev().Set(name="test_input", split="test")

    def Task(self) -> hyperparams.InstantiableParams:
        p = mt.TransformerEncDec.Params().Set(
            name="mt",
            vocab_size=12,
            model_dims=32,
            num_encoder_layers=2,
            num_decoder_layers=2,
            num_heads=2,
            hidden_dims=64,
            num_stages=2,
            num_micro_batches=2,
        )
        p.train.optimizer = optimizers.Adam.Params()
        p.train.learning_rate = 3e-3
        p.train.lr_schedule = lr_schedules.LinearWarmupRsqrt.Params().Set(warmup_steps=100)
        p.train.max_steps = 500
        return p


@model_registry.RegisterSingleTaskModel
class TransformerEncDecGPipe(base_model_params.SingleTaskModelParams):
    """The GPipe paper's deepest multilingual translation Transformer, T(64, 16384, 32).

    GPipe (Huang et al., 2019, "GPipe: Efficient Training of Giant Neural Networks
    using Pipeline Parallelism", section 5) trains Transformers T(L, H, A) with L
    encoder and L decoder layers, feed-forward hidden size H, A attention heads and
    model dimension 1024, on 102-languages-to-English translation with a shared
    64k wordpiece vocabulary. This is its largest, T(64, 16384, 32): 64 + 64
    pre-norm layers (131 cells with the two embeddings and the softmax, about 5.3B
    parameters as FPropMeta counts them; the paper reports 6B), dropout 0.1, label smoothing
    0.1, cut by FLOPs into 16 stages with 64 micro-batches (M >= 4K keeps the
    pipeline bubble, (K - 1) / (M + K - 1), under a fifth). It needs 16
    accelerators (`--num_stages` may change K).

    Not reproduced: the paper's corpus (not shipped) and its batch of 4M tokens.
    The input here is Seq2SeqInput's reverse task at the paper's vocabulary size
    and sentence lengths up to 64, a stand-in that exercises the same shapes;
    replace Train()/Dev() with a real parallel corpus. The optimizer is our choice:
    Adafactor (factored second moments keep the slots small at this size) with the
    Transformer's warmup-rsqrt schedule.
    """

    VOCAB_SIZE = 64000
    MAX_LEN = 64

    def Train(self) -> hyperparams.InstantiableParams:
        return seq2seq.Seq2SeqInput.Params().Set(
            name="train_input",
            task="reverse",
            vocab_size=self.VOCAB_SIZE,
            min_len=8,
            max_len=self.MAX_LEN,
            batch_size=1024,
            split="train",
        )

    def Dev(self) -> hyperparams.InstantiableParams:
        return self.Train().Set(name="dev_input", split="dev", repeat=False)

    def Test(self) -> hyperparams.InstantiableParams:
        return self.Dev().Set(name="test_input", split="test")

    def Task(self) -> hyperparams.InstantiableParams:
        p = mt.TransformerEncDec.Params().Set(
            name="mt",
            vocab_size=self.VOCAB_SIZE,
            model_dims=1024,
            num_encoder_layers=64,
            num_decoder_layers=64,
            num_heads=32,
            hidden_dims=16384,
            dropout_prob=0.1,
            label_smoothing=0.1,
            num_stages=16,
            num_micro_batches=64,
            partition="flops",
        )
        p.train.optimizer = optimizers.Adafactor.Params()
        p.train.learning_rate = 1e-3
        p.train.lr_schedule = lr_schedules.LinearWarmupRsqrt.Params().Set(warmup_steps=10000)
        p.train.clip_gradient_norm_to_value = 1.0
        p.train.max_steps = 500000
        return p
