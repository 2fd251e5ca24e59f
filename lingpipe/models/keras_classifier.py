"""A classifier whose network is one pipeline of cells: Keras cells, lingpipe cells, or both.

    images [b, ...] -> cell_0 -> ... -> cell_{N-1} -> logits [b, num_classes]

The cells are `PipeliningLayer` cells (for Keras layers, `KerasCell` params, e.g.
from `KerasCell.FromKeras`); the task adds the loss (softmax cross-entropy of the
labels) and accuracy, and trains through the pipeline's schedule.
"""

from __future__ import annotations

import tensorflow as tf

from lingpipe import hyperparams
from lingpipe.models import base_task
from lingpipe.nested_map import NestedMap

__all__ = [
    "PipelinedClassifier",
]


class PipelinedClassifier(base_task.BaseTask):
    """input_batch: images [b, ...] float, labels [b] int; the cells give logits."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("num_classes", 10, "Number of classes: the last cell's output dims.")
        p.Define(
            "cells", [], "Layer params of the cells, run in order: images -> logits [b, classes]."
        )
        base_task.DefinePipelineParams(p)
        return p

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        if not isinstance(p.cells, (list, tuple)) or not p.cells:
            raise ValueError(
                f"{self.path}: expected cells to be a non-empty list of layer params, "
                f"received cells={p.cells!r:.120}"
            )
        self.CreateChild("pipeline", self.PipelineParams(p))

    @classmethod
    def PipelineParams(cls, p: hyperparams.Params, where: str = "") -> hyperparams.Params:
        """The params of the `pipeline` child that task params `p` build (nothing built).
        Where the first cell names its input's shape (a KerasCell's input_shape) and the
        input its batch size, they are the pipeline's input_shapes: what the planner and
        partition='flops' cost the cells by."""
        first = p.cells[0] if isinstance(p.cells, (list, tuple)) and p.cells else None
        shape = first.Get("input_shape") if first is not None and "input_shape" in first else None
        batch = p.input.batch_size if p.input is not None and "batch_size" in p.input else None
        shapes = [[batch, *shape]] if shape and batch else None
        return base_task.PipelineLayerParams(p, list(p.cells or []), shapes)

    def PipelineInputs(self, theta: NestedMap, input_batch: NestedMap) -> tuple:
        """(images,) as the pipeline's float inputs."""
        return (tf.cast(input_batch.images, self.fprop_dtype),)

    def ComputePredictions(self, theta: NestedMap, input_batch: NestedMap) -> tf.Tensor:
        """logits [b, num_classes]."""
        return self.pipeline.FProp(theta.pipeline, *self.PipelineInputs(theta, input_batch))

    def ComputeLoss(
        self, theta: NestedMap, predictions: tf.Tensor, input_batch: NestedMap
    ) -> NestedMap:
        """Means over the batch, as (value, number of examples): `loss` and `accuracy`."""
        p = self.params
        logits = tf.cast(predictions, tf.float32)
        if logits.shape.rank != 2 or logits.shape[-1] != p.num_classes:
            raise ValueError(
                f"{self.path}: expected the last cell to give logits [batch, num_classes="
                f"{p.num_classes}], received shape {logits.shape.as_list()}"
            )
        labels = tf.cast(input_batch.labels, tf.int32)
        xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float32)
        count = tf.cast(tf.shape(labels)[0], tf.float32)
        return NestedMap(
            loss=(tf.reduce_mean(xent), count), accuracy=(tf.reduce_mean(correct), count)
        )
