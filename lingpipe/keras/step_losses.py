"""What a Keras pipeline's training step computes around the pipeline: each micro-batch's
loss as Keras weighs it, the batch's merged predictions, and float16's loss scale.

    predictions = []
    loss_fn = step_losses.LossFn(model, predictions)   # run on the last stage
    ... pipeline.ForwardBackward(theta, x, loss_fn, loss_inputs, loss_scale)
    y_pred = step_losses.Stitched(predictions)         # the batch's, masks included

A micro-batch's loss is the compiled loss (Keras' compute_loss; none where compile was
given no loss) plus the losses its layers added, weighted as Keras reduces a batch: by
its rows, or by the valid entries of a masked output (Keras divides a masked loss by
them), so the weighted mean over micro-batches is the plain model's loss of the batch.
A compiled loss reduced by 'sum' counts whole (times the batch's rows over the
micro-batch's), and one reduced by 'mean_with_sample_weight' as its share of the
batch's sample weights; the outputs' losses must share one reduction (Reduction).
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
    "Reduction",
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
    (the step updates them once, on the whole batch, as Keras' own step does); 0 for a
    model compiled without a loss (its layers' losses are all of it)."""
    compile_loss = model._compile_loss  # noqa: SLF001
    if compile_loss is None:
        return tf.zeros([], tf.float32)
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


# Keras' reductions of a loss over the batch that the rows weigh exactly (module doc).
_MEANS = ("sum_over_batch_size", "mean")


def Reduction(model: keras.Model) -> str:
    """The one reduction of the model's compiled losses ('sum_over_batch_size' without
    any); a ValueError where its outputs' losses reduce the batch differently, or one
    does not reduce it (reduction=None)."""
    compile_loss = model._compile_loss  # noqa: SLF001
    losses = [getattr(compile_loss, "_user_loss", None)] if compile_loss is not None else []
    # A loss given by name or as a function reduces by Keras' mean.
    reductions = [
        x.reduction if isinstance(x, keras.losses.Loss) else "sum_over_batch_size"
        for x in keras.tree.flatten(losses)
        if x is not None
    ]
    if None in reductions:
        raise ValueError(
            f"{type(model).__name__} {model.name!r}: a compiled loss with reduction=None: "
            "Keras trains on the sum of its per-example losses and reports their mean, "
            "and the pipeline weighs one reduced loss per micro-batch; expected "
            "reduction='sum' for the same gradients, or Keras' default mean"
        )
    found = {"sum_over_batch_size" if r in _MEANS else r for r in reductions}
    found = found or {"sum_over_batch_size"}
    if len(found) > 1:
        raise ValueError(
            f"{type(model).__name__} {model.name!r}: its compiled losses reduce the batch "
            f"differently ({sorted(map(str, found))}); expected one reduction for every "
            "output, as the pipeline weighs each micro-batch's loss by one count"
        )
    return found.pop()


def LossFn(model: keras.Model, predictions: list, batch: Any, sample_weight: Any) -> Any:
    """loss_fn(y_pred, layer_loss, micro) of the pipeline's ForwardBackward (module doc).
    Appends each micro-batch's (y_pred, flat masks, rows) to `predictions`. `batch` (the
    batch's rows) and `sample_weight` (the batch's, or None) weigh a loss reduced by
    'sum' or 'mean_with_sample_weight' (Reduction)."""
    reduction = Reduction(model)
    whole = None  # the batch's sample weights, where its loss is their weighted mean
    if reduction == "mean_with_sample_weight" and sample_weight is not None:
        whole = tf.reduce_sum(tf.cast(sample_weight, tf.float32))

    def Loss(y_pred: Any, layer_loss: Any, micro: NestedMap) -> NestedMap:
        if model._compile_loss is None and layer_loss is None:  # noqa: SLF001
            raise ValueError(
                f"{type(model).__name__} {model.name!r}: no loss to compute: compile() was "
                "given no loss and no layer adds one; expected compile(loss=...) or a "
                "layer's add_loss"
            )
        loss = MicroBatchLoss(model, micro.y, y_pred, micro.get("sample_weight"))
        flat = tf.nest.flatten(y_pred)
        masks = [masking.get_keras_mask(t) for t in flat]
        if not base_layer.IsRecomputing():
            predictions.append((y_pred, masks, micro.row))
        rows = tf.cast(tf.shape(micro.row)[0], loss.dtype)
        weight = rows
        masked = [m for m in masks if m is not None]
        if masked:
            _CheckMaskedLoss(model, len(flat), layer_loss, reduction)
            weight = tf.reduce_sum(tf.cast(masked[0], loss.dtype))
        # Weighted by rows, each loss counts as its share of the batch's loss: a sum's
        # whole, a weighted mean's share of the batch's sample weights.
        if reduction == "sum" or whole is not None:
            loss *= tf.cast(batch, loss.dtype) / rows
        if whole is not None:
            mine = tf.reduce_sum(tf.cast(micro.sample_weight, loss.dtype))
            loss *= mine / tf.cast(whole, loss.dtype)
        if layer_loss is not None:
            loss += tf.cast(layer_loss, loss.dtype)
        return NestedMap(loss=(loss, weight))

    return Loss


def _CheckMaskedLoss(model: keras.Model, num_outputs: int, layer_loss: Any, reduction: str) -> None:
    """A masked output's loss is weighted by its valid entries; with other outputs or
    with layers' losses (weighted by rows), or reduced otherwise than by Keras' mean,
    one step cannot weigh both exactly."""
    if reduction != "sum_over_batch_size":
        raise ValueError(
            f"{type(model).__name__} {model.name!r}: an output with a Keras mask and a loss "
            f"reduced by {reduction!r}: the pipeline weighs a masked loss by its valid "
            "entries, as Keras' mean does; expected reduction='sum_over_batch_size'"
        )
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
