"""A test-only model family for the trainer's tests, imported as `params.regression`.

tests/runners/test_trainer.py runs the trainer with this folder on `params.__path__`.
`Regression` learns y = x . w over inputs in a fixed order (no shuffle), so a test
can compute which examples each step and each worker reads. `PoisonedRegression`'s
example `nan_example` has a NaN feature, which reaches the loss at step
nan_example // batch_size + 1.
"""

import tensorflow as tf

from lingpipe import hyperparams, model_registry, optimizers
from lingpipe.inputs import base_input
from lingpipe.layers import linear
from lingpipe.models import base_model_params, base_task
from lingpipe.nested_map import NestedMap

DIMS = 4


class RegressionInput(base_input.BaseInputGenerator):
    """x ~ N(0, 1) seeded by the example's index, y = x . [1, 2, 3, 4]; in index order."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("nan_example", -1, "Index of the example whose x is NaN (-1: none).")
        return p

    @property
    def shuffle(self) -> bool:
        return False

    def NumExamples(self, split=None) -> int:
        return 512

    def _Example(self, index):
        x = tf.random.stateless_normal([DIMS], tf.stack([index, tf.constant(7, tf.int64)]))
        y = tf.reduce_sum(x * tf.range(1.0, DIMS + 1.0), keepdims=True)
        poisoned = tf.equal(index, self.params.nan_example)
        x = tf.where(poisoned, tf.fill([DIMS], float("nan")), x)
        return NestedMap(x=x, y=y)


class RegressionTask(base_task.BaseTask):
    """Two linear cells pipelined over num_stages devices; mean squared error."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        return base_task.DefinePipelineParams(super().Params())

    def __init__(self, params):
        super().__init__(params)
        p = self.params
        cell = linear.LinearLayer.Params().Set(input_dims=DIMS, output_dims=DIMS)
        last = linear.LinearLayer.Params().Set(input_dims=DIMS, output_dims=1)
        self.CreateChild("pipeline", base_task.PipelineLayerParams(p, [cell, last]))

    def ComputePredictions(self, theta, input_batch):
        return self.pipeline.FProp(theta.pipeline, input_batch.x)

    def ComputeLoss(self, theta, predictions, input_batch):
        loss = tf.reduce_mean(tf.square(predictions - input_batch.y))
        return NestedMap(loss=(loss, tf.cast(tf.shape(predictions)[0], tf.float32)))


@model_registry.RegisterSingleTaskModel
class Regression(base_model_params.SingleTaskModelParams):
    """Batches of 8, two stages of one linear cell each, 2 micro-batches, SGD."""

    def Train(self):
        return RegressionInput.Params().Set(batch_size=8)

    def Task(self):
        p = RegressionTask.Params().Set(name="regression", num_stages=2, num_micro_batches=2)
        p.train.optimizer = optimizers.SGD.Params()
        p.train.learning_rate = 0.01
        p.train.max_steps = 20
        return p


@model_registry.RegisterSingleTaskModel
class PoisonedRegression(Regression):
    """Example 40 is NaN: with batches of 8 the loss turns NaN at step 6."""

    def Train(self):
        return RegressionInput.Params().Set(batch_size=8, nan_example=40)
