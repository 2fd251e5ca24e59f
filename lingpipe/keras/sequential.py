"""PipelinedSequential: a keras.Model whose layers run as a GPipe pipeline over devices.

    model = lingpipe.keras.PipelinedSequential(
        [keras.layers.Dense(256, activation='relu'), keras.layers.LayerNormalization(),
         keras.layers.Dense(10)],
        num_stages=2, num_micro_batches=4, input_shape=(784,))
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=64, epochs=3, callbacks=[keras.callbacks.ModelCheckpoint(...)])

Each layer becomes one cell of a `PipeliningLayer` (a `KerasCell` built from the
layer's config, so the layers given are templates: their own weights are
neither used nor copied), and its weights are created on its stage's device.
Keras sees them as the model's weights: `get_weights`, `save_weights`,
`ModelCheckpoint` and the optimizer's slots (built by `fit` eagerly, beside each
weight) work as for any model. `fit` runs each batch through the pipeline's
schedule (`PipeliningLayer.ForwardBackward`: the compiled loss per micro-batch on
the last stage, each stage's backward on its device) and applies the gradients
with the compiled optimizer; `evaluate`, `predict` and `model(x)` run the
pipelined forward. The weights after an epoch equal those of a plain
keras.Sequential of the same layers fitted on the same batches, to float32
rounding.

The stages are built eagerly, with explicit shapes: give `input_shape` (one
example's shape), a keras.Sequential that starts with keras.Input, or call the
model on a batch (or `model.build`) before fit/evaluate/predict.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from lingpipe import base_layer, seeds
from lingpipe.layers import gpipe, keras_cell
from lingpipe.nested_map import NestedMap


def _SequentialInputShape(layers: Any) -> tuple | None:
    """One example's shape from a keras.Sequential that starts with keras.Input, else None."""
    if isinstance(layers, keras.Sequential) and getattr(layers, "_functional", None) is not None:
        return tuple(layers.inputs[0].shape[1:])
    return None


@keras.saving.register_keras_serializable(package="lingpipe")
class PipelinedSequential(keras.Model):
    """A keras.Model of Keras layers run in order as a pipeline (see the module docstring).

    Args:
      layers: Keras layers (or a keras.Sequential), run in order; one cell each.
      num_stages: pipeline stages, one device each.
      num_micro_batches: micro-batches each batch is split into.
      remat: 'always', 'except_last' or 'never' (see PipeliningLayer).
      schedule: 'gpipe', '1f1b', 'interleaved_1f1b' or 'zero_bubble': fit's order of work.
      devices: one device name per stage; None takes the cluster's first num_stages.
      num_virtual_stages: chunks per device for schedule='interleaved_1f1b'.
      partition: 'uniform', 'flops', 'params', or a list of layer counts per stage.
      input_shape: one example's shape, without the batch dim, e.g. (784,).
    """

    def __init__(
        self,
        layers: Any,
        num_stages: int = 1,
        num_micro_batches: int = 1,
        remat: str = "always",
        schedule: str = "gpipe",
        devices: Sequence[str] | None = None,
        num_virtual_stages: int = 1,
        partition: Any = "uniform",
        input_shape: Sequence[int | None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        where = f"PipelinedSequential {self.name!r}"
        templates = keras_cell.KerasLayers(layers, where)
        if not templates:
            raise ValueError(f"{where}: expected at least one Keras layer, received none")
        self._configs = [keras.layers.serialize(layer) for layer in templates]
        self._knobs = dict(
            num_stages=num_stages,
            num_micro_batches=num_micro_batches,
            remat=remat,
            schedule=schedule,
            devices=None if devices is None else list(devices),
            num_virtual_stages=num_virtual_stages,
            partition=partition,
        )
        object.__setattr__(self, "_pipeline", None)  # a tf.Module: kept out of Keras' tracking
        input_shape = input_shape if input_shape is not None else _SequentialInputShape(layers)
        if input_shape is not None:
            self._BuildPipeline(tuple(input_shape))

    # ---- Building ---------------------------------------------------------------

    def _CellParams(self, input_shape: tuple) -> list:
        """One KerasCell per layer, each told its input shape (chained through Keras)."""
        cells, shape = [], (None, *input_shape)
        for i, config in enumerate(self._configs):
            cells.append(
                keras_cell.KerasCell.Params().Set(
                    name=f"cell_{i}", layers=[config], input_shape=list(shape[1:])
                )
            )
            layer = keras.layers.deserialize(config)
            with tf.Graph().as_default():  # built for its output shape only
                layer.build(shape)
                shape = keras_cell.OutputShape(layer, shape)
        return cells

    def _BuildPipeline(self, input_shape: tuple) -> None:
        knobs = dict(self._knobs)
        if knobs["partition"] in ("flops", "params"):
            knobs["input_shapes"] = [(1, *input_shape)]  # costs per example
        p = gpipe.PipeliningLayer.Params().Set(
            name="pipeline", cell_tpl=self._CellParams(input_shape), **knobs
        )
        with tf.init_scope():
            pipeline = p.Instantiate()
        object.__setattr__(self, "_pipeline", pipeline)
        object.__setattr__(self, "_input_shape", input_shape)
        # Tracked by Keras: their weights (the pipeline's variables) are the model's.
        self.pipeline_layers = [layer for cell in pipeline.Cells() for layer in cell.keras_layers]
        self.built = True
        self._BuildOptimizer()

    def compile(self, *args: Any, **kwargs: Any) -> None:
        """keras.Model.compile; then, once the model is built, the optimizer's slots."""
        super().compile(*args, **kwargs)
        self._BuildOptimizer()

    def get_compile_config(self) -> dict | None:
        return super().get_compile_config()

    def compile_from_config(self, config: dict) -> None:
        """As keras.Model's (load_model calls it), with compile() building the slots."""
        self.compile(**keras.saving.deserialize_keras_object(config))

    def _BuildOptimizer(self) -> None:
        """Builds the compiled optimizer eagerly, each slot on its weight's device.

        Keras' own build (in fit) asks the distribution strategy to colocate each
        slot, which puts every slot on CPU:0 here, far from the stages' weights.
        """
        opt = getattr(self, "optimizer", None)
        if opt is None or opt.built or self._pipeline is None:
            return
        keras_add = opt.add_variable_from_reference

        def Colocated(reference: Any, *args: Any, **kwargs: Any) -> Any:
            device = (
                reference.value if isinstance(reference, keras.Variable) else reference
            ).device
            with tf.device(device):
                return keras_add(reference, *args, **kwargs)

        opt.add_variable_from_reference = Colocated  # this optimizer's build only
        try:
            with tf.init_scope():
                opt.build(self.trainable_variables)
        finally:
            del opt.add_variable_from_reference

    def build(self, input_shape: Any) -> None:
        """Builds the stages for inputs of `input_shape` ([batch, ...]), eagerly only."""
        shape = tuple(tf.TensorShape(input_shape).as_list()[1:])
        if not tf.executing_eagerly():
            self._RaiseUnbuilt(shape)
        self._BuildPipeline(shape)

    def _RaiseUnbuilt(self, shape: tuple) -> None:
        raise ValueError(
            f"PipelinedSequential {self.name!r}: its stages are built eagerly, with explicit "
            f"shapes, and it received none before being traced (by fit, evaluate or "
            f"predict); pass input_shape={shape} (one example's shape), start a "
            f"keras.Sequential with keras.Input, or call the model on a batch first"
        )

    @property
    def pipeline(self) -> gpipe.PipeliningLayer:
        """The PipeliningLayer that runs the layers (None before the model is built)."""
        return self._pipeline

    # ---- Running ----------------------------------------------------------------

    def call(self, inputs: Any, training: bool | None = None) -> Any:
        """inputs: [batch, *input_shape] -> the last layer's outputs [batch, ...]."""
        if self._pipeline is None:
            self._RaiseUnbuilt(tuple(inputs.shape[1:]))
        with base_layer.EvalMode(not training):
            return self._pipeline.FProp(self._pipeline.theta, inputs)

    def _Gradients(self, out: NestedMap) -> list:
        """The gradient of each of self.trainable_weights from ForwardBackward's result."""
        grads = dict(out.variable_grads)
        pipeline = self._pipeline
        for v, g in zip(tf.nest.flatten(pipeline.theta), tf.nest.flatten(out.theta_grads)):
            if g is not None:
                grads[v.ref()] = g if v.ref() not in grads else grads[v.ref()] + g
        return [grads.get(w.value.ref()) for w in self.trainable_weights]

    def train_step(self, data: Any) -> dict:
        """One batch through the pipeline's schedule; the compiled loss per micro-batch."""
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if self._pipeline is None:
            self._RaiseUnbuilt(tuple(x.shape[1:]))
        predictions = []

        def LossFn(y_pred: Any, batch: NestedMap) -> NestedMap:
            loss = self.compute_loss(
                x=None, y=batch.y, y_pred=y_pred, sample_weight=batch.get("sample_weight")
            )
            if not base_layer.IsRecomputing():  # forwards run in micro-batch order
                predictions.append(y_pred)
            batch_size = tf.shape(tf.nest.flatten(y_pred)[0])[0]
            return NestedMap(loss=(loss, tf.cast(batch_size, loss.dtype)))

        loss_inputs = NestedMap(y=y)
        if sample_weight is not None:
            loss_inputs.sample_weight = sample_weight
        pipeline = self._pipeline
        with seeds.StepSeedScope(self.optimizer.iterations):
            out = pipeline.ForwardBackward(pipeline.theta, x, LossFn, loss_inputs)
        self.optimizer.apply(self._Gradients(out), self.trainable_weights)
        loss, count = out.metrics.loss
        self._loss_tracker.update_state(loss, sample_weight=count)
        y_pred = tf.nest.map_structure(lambda *t: tf.concat(t, axis=0), *predictions)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    # ---- Saving -----------------------------------------------------------------

    def get_config(self) -> dict:
        config = dict(super().get_config(), layers=list(self._configs), **self._knobs)
        shape = getattr(self, "_input_shape", None)
        config["input_shape"] = None if shape is None else list(shape)
        return config

    @classmethod
    def from_config(cls, config: dict) -> PipelinedSequential:
        config = dict(config)
        layers = [keras.layers.deserialize(c) for c in config.pop("layers")]
        return cls(layers, **config)
