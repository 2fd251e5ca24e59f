"""What a Keras pipeline's training step computes around the pipeline: each micro-batch's
loss as Keras weighs it, the batch's merged predictions, and float16's loss scale.

    predictions = []
    loss_fn = step_losses.LossFn(model, predictions)   # run on the last stage
    ... pipeline.ForwardBackward(theta, x, loss_fn, loss_inputs, loss_scale)
    y_pred = step_losses.Stitched(predictions)         # the batch's, masks included

A micro-batch's loss is the compiled loss (Keras' compute_loss) plus the losses its
layers added, weighted as Keras reduces a batch: by its rows, or by the valid entries
of a masked output (Keras divides a masked loss by them), so the weighted mean over
micro-batches is the plain model's loss of the batch.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

import keras
import tensorflow as tf
from keras.src.backend.common import masking  # Keras masks are not in its public API

from lingpipe import base_layer
from lingpipe.nested_map import NestedMap

__all__ = [
    "LossFn",
    "LossScale",
    "MicroBatchLoss",
    "Scaled",
    "Stitched",
]


class _NoLossMetrics:
    """Stands in for CompileLoss' per-output loss metrics while a micro-batch's loss is
    computed (they are updated once, on the whole batch): every metric is None."""

    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Any:
        return itertools.repeat(None)


def MicroBatchLoss(model: keras.Model, y: Any, y_pred: Any, sample_weight: Any) -> tf.Tensor:
    """The compiled loss of one micro-batch, its per-output loss metrics left alone
    (the step updates them once, on the whole batch, as Keras' own step does)."""
    compile_loss = model._compile_loss  # noqa: SLF001
    if compile_loss is None:
        return model.compute_loss(y=y, y_pred=y_pred, sample_weight=sample_weight)
    with _LossMetricsOff(compile_loss):
        return model.compute_loss(y=y, y_pred=y_pred, sample_weight=sample_weight)


@contextlib.contextmanager
def _LossMetricsOff(compile_loss: Any) -> Any:
    """CompileLoss with its per-output loss metrics (`_metrics`, which its call reads)
    replaced by _NoLossMetrics, also when this call is the one that builds it (the first
    micro-batch of the first step): else that micro-batch's losses joined the metrics."""
    kept: list = []

    def Off() -> None:
        kept.append(compile_loss._metrics)  # noqa: SLF001
        compile_loss._metrics = _NoLossMetrics()  # noqa: SLF001

    own = vars(compile_loss)
    had_build, build = "build" in own, own.get("build")
    if compile_loss.built:
        Off()
    else:
        keras_build = compile_loss.build

        def BuildThenOff(*args: Any, **kwargs: Any) -> Any:
            result = keras_build(*args, **kwargs)
            Off()
            return result

        compile_loss.build = BuildThenOff
    try:
        yield
    finally:
        if had_build:
            compile_loss.build = build
        elif "build" in vars(compile_loss):
            del compile_loss.build
        if kept:
            compile_loss._metrics = kept[0]  # noqa: SLF001


def LossFn(model: keras.Model, predictions: list) -> Any:
    """loss_fn(y_pred, layer_loss, micro) of the pipeline's ForwardBackward (module doc).
    Appends each micro-batch's (y_pred, flat masks, rows) to `predictions`."""

    def Loss(y_pred: Any, layer_loss: Any, micro: NestedMap) -> NestedMap:
        loss = MicroBatchLoss(model, micro.y, y_pred, micro.get("sample_weight"))
        flat = tf.nest.flatten(y_pred)
        masks = [masking.get_keras_mask(t) for t in flat]
        if not base_layer.IsRecomputing():
            predictions.append((y_pred, masks, micro.row))
        weight = tf.cast(tf.shape(micro.row)[0], loss.dtype)
        masked = [m for m in masks if m is not None]
        if masked:
            _CheckMaskedLoss(model, len(flat), layer_loss)
            weight = tf.reduce_sum(tf.cast(masked[0], loss.dtype))
        if layer_loss is not None:
            loss += tf.cast(layer_loss, loss.dtype)
        return NestedMap(loss=(loss, weight))

    return Loss


def _CheckMaskedLoss(model: keras.Model, num_outputs: int, layer_loss: Any) -> None:
    """A masked output's loss is weighted by its valid entries; with other outputs or
    with layers' losses (weighted by rows) one step cannot weigh both exactly."""
    other = "several outputs" if num_outputs > 1 else "losses added by layers"
    if num_outputs > 1 or layer_loss is not None:
        raise ValueError(
            f"{type(model).__name__} {model.name!r}: an output with a Keras mask and "
            f"{other} in one model: the pipeline weighs each micro-batch's loss by "
            "one count (the mask's valid entries) and would differ from the plain "
            "model; apply the mask in the loss (sample_weight) instead of a Keras mask"
        )


def Stitched(predictions: list) -> Any:
    """The micro-batches' (y_pred, masks, rows) as the batch's y_pred, in the batch's
    row order, each output with its merged Keras mask."""
    rows = [r for _, _, r in predictions]
    flat = []
    for i, leaf in enumerate(zip(*[tf.nest.flatten(y) for y, _, _ in predictions])):
        merged = tf.dynamic_stitch(rows, list(leaf))
        masks = [m[i] for _, m, _ in predictions]
        if masks[0] is not None:
            masking.set_keras_mask(merged, tf.dynamic_stitch(rows, masks))
        flat.append(merged)
    return tf.nest.pack_sequence_as(predictions[0][0], flat)


def LossScale(optimizer: Any) -> Any:
    """The optimizer's loss scale (mixed_float16's LossScaleOptimizer), or None."""
    if not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return None
    return tf.convert_to_tensor(optimizer.scale_loss(tf.constant(1.0)))


def Scaled(g: Any, factor: tf.Tensor) -> Any:
    """g * factor for a gradient (None, a tensor or tf.IndexedSlices)."""
    if g is None:
        return None
    if isinstance(g, tf.IndexedSlices):
        values = g.values * tf.cast(factor, g.values.dtype)
        return tf.IndexedSlices(values, g.indices, g.dense_shape)
    return g * tf.cast(factor, g.dtype)
