"""A GPipe AmoebaNet image classifier (Real et al. 2019; GPipe's image model).

The whole network is ONE PipeliningLayer (`pipeline`) whose cells pass a NestedMap
state to one another:

    stem cell         images [b, h, w, c] -> x = prev = BN(conv3x3(images))
    reduction cells   (num_stem_reduction_cells, ImageNet's stem) x, prev -> x', prev=x
    normal cells      num_normal_cells per stack, num_reduction_cells + 1 stacks,
                      a reduction cell between stacks (stride 2, filters doubled)
    head cell         x -> ReLU, global average pool, fully connected, softmax
                      -> xent [b], correct [b], logits [b, num_classes]

The cells, their operations and the genotypes (AmoebaNet-A and -B) are in
`amoeba_cells`. Batch norm is micro-batch aware: each micro-batch is normalized
with its own moments, and the moving averages are updated once per step from the
statistics of all micro-batches. Left out of the reference: drop path and the
auxiliary head.
"""

from __future__ import annotations

import tensorflow as tf

from lingpipe import asserts, hyperparams
from lingpipe.layers import normalization
from lingpipe.models import amoeba_cells, base_task
from lingpipe.nested_map import NestedMap

__all__ = [
    "AmoebaNetClassifier",
]


class AmoebaNetClassifier(base_task.BaseTask):
    """An AmoebaNet image classifier, as one GPipe pipeline (see the module docstring).

    input_batch: images [b, image_size, image_size, channels] float, labels [b] int.
    """

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("num_classes", 10, "Number of classes.")
        p.Define("filters", 16, "Filters of the first stack's cells (doubled at each reduction).")
        p.Define("num_normal_cells", 2, "Normal cells per stack (AmoebaNet's N).")
        p.Define("num_reduction_cells", 2, "Reduction cells between the stacks.")
        p.Define("num_stem_reduction_cells", 0, "Reduction cells after the stem (ImageNet: 2).")
        p.Define(
            "stem_filters",
            None,
            "Filters of the stem convolution; None: filters / 2**num_stem_reduction_cells.",
        )
        p.Define("stem_stride", 1, "Stride of the stem convolution (ImageNet: 2).")
        p.Define("image_size", 8, "Height and width of the input images.")
        p.Define("channels", 1, "Channels of the input images.")
        p.Define(
            "genotype", "amoeba_net_a", f"Cell genotype: one of {sorted(amoeba_cells.GENOTYPES)}."
        )
        p.Define("label_smoothing", 0.0, "Label smoothing of the training loss.")
        p.Define("batch_norm_decay", 0.99, "Decay of batch norm's moving averages.")
        p.Define("batch_norm_epsilon", 1e-3, "Batch norm's epsilon.")
        base_task.DefinePipelineParams(p)
        return p

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        for name in ("image_size", "channels"):
            if p.input is not None and name in p.input and p.input.Get(name) != p.Get(name):
                raise ValueError(
                    f"{self.path}: expected the input's {name} to equal {name}, received "
                    f"input.{name}={p.input.Get(name)}, {name}={p.Get(name)}"
                )
        self.CreateChild("pipeline", self.PipelineParams(p, self.path))

    @classmethod
    def PipelineParams(cls, p: hyperparams.Params, where: str = "") -> hyperparams.Params:
        """The PipeliningLayer's params: stem, cells, head (builds nothing)."""
        for name in ("num_classes", "filters", "num_normal_cells", "num_reduction_cells"):
            asserts.Positive(p.Get(name), name, where=where)
        for name in ("image_size", "channels", "stem_stride"):
            asserts.Positive(p.Get(name), name, where=where)
        asserts.In(p.genotype, sorted(amoeba_cells.GENOTYPES), "genotype", where=where)
        n_stem = p.num_stem_reduction_cells
        asserts.Ge(n_stem, 0, "num_stem_reduction_cells", where=where)
        asserts.DivisibleBy(
            p.filters, 2**n_stem, "filters", "2**num_stem_reduction_cells", where=where
        )
        stem_filters = p.stem_filters or p.filters >> n_stem
        asserts.Positive(stem_filters, "stem_filters", where=where)
        bn = normalization.BatchNormLayer.Params().Set(
            decay=p.batch_norm_decay, epsilon=p.batch_norm_epsilon
        )
        cells = [
            amoeba_cells.StemCell.Params().Set(
                channels=p.channels, filters=stem_filters, stride=p.stem_stride, bn_tpl=bn.Copy()
            )
        ]
        shape = NestedMap(x=stem_filters, prev=stem_filters, prev_stride=1)

        def Add(filters: int, reduction: bool) -> None:
            cells.append(
                amoeba_cells.AmoebaCell.Params().Set(
                    genotype=p.genotype,
                    reduction=reduction,
                    filters=filters,
                    x_channels=shape.x,
                    prev_channels=shape.prev,
                    prev_stride=shape.prev_stride,
                    bn_tpl=bn.Copy(),
                )
            )
            shape.prev, shape.x, shape.prev_stride = shape.x, filters, 2 if reduction else 1

        for i in range(n_stem):
            Add(p.filters >> (n_stem - i), True)
        filters = p.filters
        for stack in range(p.num_reduction_cells + 1):
            for _ in range(p.num_normal_cells):
                Add(filters, False)
            if stack < p.num_reduction_cells:
                filters *= 2
                Add(filters, True)
        cells.append(
            amoeba_cells.HeadCell.Params().Set(
                input_dims=filters, num_classes=p.num_classes, label_smoothing=p.label_smoothing
            )
        )
        return base_task.PipelineLayerParams(p, cells, cls._InputShapes(p, where))

    @classmethod
    def _InputShapes(cls, p: hyperparams.Params, where: str) -> tuple | None:
        """The pipeline's input shapes from the input params (for partition by cost and
        the partition report); None without them for partition 'uniform' or counts."""
        if p.input is None or "batch_size" not in p.input:
            if not isinstance(p.partition, str) or p.partition == "uniform":
                return None
            raise ValueError(
                f"{where}: partition={p.partition!r} needs the batch size; set input params "
                f"with batch_size, or use partition='uniform'"
            )
        return (cls.InputShape(p, p.input.batch_size),)

    @classmethod
    def InputShape(cls, p: hyperparams.Params, batch_size: int) -> NestedMap:
        """The pipeline's input state's shapes for a batch of `batch_size`."""
        size = p.image_size
        return NestedMap(
            images=tf.TensorShape([batch_size, size, size, p.channels]),
            labels=tf.TensorShape([batch_size]),
        )

    def ComputePredictions(self, theta: NestedMap, input_batch: NestedMap) -> NestedMap:
        """Returns NestedMap(xent [b], correct [b], logits [b, num_classes])."""
        return self.pipeline.FProp(theta.pipeline, *self.PipelineInputs(theta, input_batch))

    def PipelineInputs(self, theta: NestedMap, input_batch: NestedMap) -> tuple:
        """(state,): images checked and cast, labels."""
        p = self.params
        images = tf.convert_to_tensor(input_batch.images)
        expected = [p.image_size, p.image_size, p.channels]
        if images.shape.rank != 4 or images.shape[1:].as_list() != expected:
            raise ValueError(
                f"{self.path}: expected images of shape [batch, image_size, image_size, "
                f"channels] = [batch, {', '.join(map(str, expected))}], received "
                f"images.shape={images.shape.as_list() if images.shape.rank else images.shape}"
            )
        state = NestedMap(
            images=tf.cast(images, self.fprop_dtype),
            labels=tf.cast(input_batch.labels, tf.int32),
        )
        return (state,)

    def ComputeLoss(
        self, theta: NestedMap, predictions: NestedMap, input_batch: NestedMap
    ) -> NestedMap:
        """Means over the batch, each as (value, number of examples): `loss` (the
        training cross-entropy) and `accuracy`."""
        count = tf.cast(tf.shape(predictions.xent)[0], predictions.xent.dtype)
        return NestedMap(
            loss=(tf.reduce_mean(predictions.xent), count),
            accuracy=(tf.reduce_mean(predictions.correct), count),
        )
