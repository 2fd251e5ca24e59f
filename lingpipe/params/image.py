"""Image classifiers: GPipe AmoebaNets, on the 8x8 digits and at ImageNet scale."""

from __future__ import annotations

from lingpipe import hyperparams, lr_schedules, model_registry, optimizers
from lingpipe.inputs import image as image_input
from lingpipe.models import base_model_params, image

__all__ = [
    "AmoebaNetDigitsTiny",
    "AmoebaNetImageNetGPipe",
    "DigitsData",
]


class DigitsData(base_model_params.SingleTaskModelParams):
    """The UCI 8x8 digits: batches of 32 to train, each eval split in one batch."""

    def Train(self) -> hyperparams.InstantiableParams:
        return image_input.DigitsInput.Params().Set(name="train_input", batch_size=32)

    def Dev(self) -> hyperparams.InstantiableParams:
        # 179 images in each eval split: one batch holds all of them.
        return self.Train().Set(name="dev_input", split="dev", batch_size=179, repeat=False)

    def Test(self) -> hyperparams.InstantiableParams:
        return self.Dev().Set(name="test_input", split="test")


@model_registry.RegisterSingleTaskModel
class AmoebaNetDigitsTiny(DigitsData):
    """AmoebaNet-A with 16 filters, N=1, one reduction, on the 8x8 digits; 2 stages.

    Cells: stem, normal (16), reduction (32, 4x4), normal (32), head: 60k weights, cut
    into 2 stages of 2 micro-batches. On CPU its test accuracy in eval mode (batch
    norm's moving statistics) passes 90% within about 75 steps of batch 32 (97% at 150).
    """

    def Task(self) -> hyperparams.InstantiableParams:
        p = image.AmoebaNetClassifier.Params().Set(
            name="image",
            num_classes=image_input.NUM_CLASSES,
            filters=16,
            num_normal_cells=1,
            num_reduction_cells=1,
            image_size=image_input.IMAGE_SHAPE[0],
            channels=image_input.IMAGE_SHAPE[2],
            genotype="amoeba_net_a",
            batch_norm_decay=0.9,  # few steps: the moving statistics must catch up fast
            num_stages=2,
            num_micro_batches=2,
        )
        p.train.optimizer = optimizers.Adam.Params()
        p.train.learning_rate = 3e-3
        p.train.max_steps = 300
        return p


@model_registry.RegisterSingleTaskModel
class AmoebaNetImageNetGPipe(base_model_params.SingleTaskModelParams):
    """GPipe's ImageNet model: AmoebaNet-B (18, 512) at 480x480, over 8 stages.

    Huang et al., 2019, "GPipe: Efficient Training of Giant Neural Networks using
    Pipeline Parallelism", section 4: AmoebaNet-B with N = 6 normal cells per stack
    (L = 18 in all, three stacks), D = 512 filters in the first stack (doubled at each
    of the 2 reductions), input 480x480, 557M parameters, 84.4% top-1 on ImageNet.
    Here: the ImageNet stem (3x3 conv of stride 2 with 32 filters, then 2 reduction
    cells of 128 and 256 filters), label smoothing 0.1, 24 cells cut by FLOPs into 8
    stages (2 to 5 cells, 12-18 TFLOPs each per batch of 256), 32 micro-batches.
    FPropMeta counts 494M parameters and 510 GFLOPs per image: each cell here
    projects its concatenated states back to D once, at its end, where the reference
    projects both inputs of the next cell, so it has fewer weights. AmoebaNet's
    reference recipe uses RMSProp, which lingpipe lacks: here momentum SGD with a
    cosine schedule. There is no ImageNet reader in lingpipe: Train() gives random
    images of the right shape (for throughput); point it at your data's input params.
    """

    IMAGE_SIZE = 480

    def Train(self) -> hyperparams.InstantiableParams:
        return image_input.SyntheticImageInput.Params().Set(
            name="train_input", batch_size=256, image_size=self.IMAGE_SIZE, num_classes=1000
        )

    def Dev(self) -> hyperparams.InstantiableParams:
        return self.Train().Set(name="dev_input", split="dev", repeat=False, num_examples=50000)

    def Test(self) -> hyperparams.InstantiableParams:
        return self.Dev().Set(name="test_input", split="test")

    def Task(self) -> hyperparams.InstantiableParams:
        p = image.AmoebaNetClassifier.Params().Set(
            name="image",
            num_classes=1000,
            filters=512,
            num_normal_cells=6,
            num_reduction_cells=2,
            num_stem_reduction_cells=2,
            stem_filters=32,
            stem_stride=2,
            image_size=self.IMAGE_SIZE,
            channels=3,
            genotype="amoeba_net_b",
            label_smoothing=0.1,
            batch_norm_decay=0.99,
            num_stages=8,
            num_micro_batches=32,
            partition="flops",
        )
        p.train.optimizer = optimizers.Momentum.Params().Set(alpha=0.9, use_nesterov=True)
        p.train.learning_rate = 0.1
        p.train.lr_schedule = lr_schedules.Cosine.Params().Set(
            warmup_steps=5000, total_steps=250000
        )
        p.train.l2_regularizer_weight = 4e-5
        p.train.clip_gradient_norm_to_value = 10.0
        p.train.max_steps = 250000
        return p
