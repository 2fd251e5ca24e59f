"""Models built from Keras layers (lingpipe.layers.keras_cell), pipelined by lingpipe."""

from __future__ import annotations

from lingpipe import hyperparams, model_registry, optimizers
from lingpipe.inputs import image as image_input
from lingpipe.layers import keras_cell, linear
from lingpipe.models import keras_classifier
from lingpipe.params import image as image_params

__all__ = [
    "KerasMlp",
]


@model_registry.RegisterSingleTaskModel
class KerasMlp(image_params.DigitsData):
    """An MLP of Keras layers on the 8x8 digits, a lingpipe projection as its head; 2 stages.

    Cells: Keras [Flatten, Dense(64, relu)], Keras [Dense(64, relu), LayerNormalization,
    Dropout(0.1)], lingpipe ProjectionLayer(64 -> 10): 9k weights, 2 micro-batches.
    """

    HIDDEN = 64

    def Task(self) -> hyperparams.InstantiableParams:
        hidden = self.HIDDEN
        # Keras configs, not Keras objects: a params module must not start TensorFlow.
        layer = keras_cell.LayerConfig
        cells = [
            keras_cell.KerasCell.Params().Set(
                layers=[layer("Flatten"), layer("Dense", units=hidden, activation="relu")],
                input_shape=list(image_input.IMAGE_SHAPE),
            ),
            keras_cell.KerasCell.Params().Set(
                layers=[
                    layer("Dense", units=hidden, activation="relu"),
                    layer("LayerNormalization"),
                    layer("Dropout", rate=0.1),
                ],
                input_shape=[hidden],
            ),
            linear.ProjectionLayer.Params().Set(
                input_dims=hidden, output_dims=image_input.NUM_CLASSES, activation="NONE"
            ),
        ]
        p = keras_classifier.PipelinedClassifier.Params().Set(
            name="classifier",
            num_classes=image_input.NUM_CLASSES,
            cells=cells,
            num_stages=2,
            num_micro_batches=2,
        )
        p.train.optimizer = optimizers.Adam.Params()
        p.train.learning_rate = 3e-3
        p.train.max_steps = 300
        return p
