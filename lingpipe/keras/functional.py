"""Pipeline: any built Keras 3 model (Functional, or keras.Sequential) as a pipelined keras.Model.

    lingpipe.cluster.SetLogicalCpuDevices(4)          # on CPU only, before any TF work
    base = keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3), classes=10)
    model = lingpipe.keras.Pipeline(base, num_stages=4, num_micro_batches=8)
    print(model.partition_report())                    # layers, params, FLOPs, crossing tensors
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=False))
    model.fit(x, y, batch_size=64, epochs=1)

The model's graph is traced into its layer calls in a topological order (nested
Functional models inlined, so a cut can fall inside a backbone) and cut into
stages by cost (`partition='flops'`, `'params'`, `'uniform'`, `'profile'`: each
layer call's forward and backward timed on one example, or node counts per stage) or at layer
names (`split_points=['conv4_block1_1_conv', ...]`, where stages 1.. begin).
Every tensor alive across a cut (a skip connection, a mask, a second input, an
output needed at the end) travels to the next stage with the activations. The
model's own weights (pretrained or fresh) move to their stages' devices and are
the pipeline's weights: before training, `predict` equals the model's. The model
given is the one trained: build a copy first (`keras.models.clone_model` +
`set_weights`) to keep a plain one.

Supported:
  - Functional models and keras.Sequential (with or without keras.Input, built);
    several inputs and outputs (lists or dicts), the compiled losses, loss weights
    and metrics per output; keras.ops calls in the graph (`x * mask[..., None]`);
  - nested Functional / Sequential models used as layers (also called twice); a
    layer called at several places, also on two stages (a tied embedding at the
    input and as the output projection): its weight lives on its first stage's
    device and gets the sum of both stages' gradients;
  - BatchNormalization: in training each micro-batch is normalized with its own
    moments (GPipe's rule, not the whole batch's), and the moving statistics end as
    the plain model's run on the same micro-batches one after another (threaded
    through each stage's forwards in micro-batch order, assigned once per step);
  - Keras dropout and other SeedGenerator layers: stateless seeds per step,
    micro-batch and the generator's own seed, so recomputation (remat) reproduces
    the masks and keras.utils.set_random_seed sets them;
  - Keras masks (Embedding(mask_zero=True)) crossing a cut;
  - batches of any size (a partial last batch, validation_split): split at run time
    into micro-batches differing by at most one row;
  - every schedule, remat: one stage per device ('gpipe', '1f1b', 'zero_bubble', ...),
    two (the V-shaped 'zbv', 'dualpipev') or num_virtual_stages ('interleaved_1f1b',
    'looped_bfs', 'interleaved_zero_bubble'), a Schedule value or a CSV file: the
    graph is cut into as many stages as the schedule runs, each placed on its device;
  - a caller's own tf.GradientTape over model(x, training=True): fill-drain forwards
    whose gradient is the executor's backwards, each on its stage's device.

  - the losses layers add (add_loss, activity regularizers), on any stage: they travel
    with the activations to the last stage and join the micro-batch's loss;
  - Keras masks on outputs (a masked loss weighted by its valid entries, as Keras does);
  - mixed precision (mixed_float16 with the LossScaleOptimizer's scaling, mixed_bfloat16);
  - embeddings' gradients reach the optimizer as tf.IndexedSlices, as the plain model's.
  tests/keras/conformance.py is the table of Keras features checked against the plain
  model, and of what is refused.

Not supported: subclassed keras.Model (no graph to cut); state that one layer on two
stages updates (a batch norm called twice) under several micro-batches (refused in one
line: with one, it is threaded in program order); a masked output beside other
outputs or layers' losses (refused in one line); compile(jit_compile=True) (refused);
a layer that assigns its trainable weights in its call, as SpectralNormalization does
in training; a stateful RNN; a sparse or ragged input; a model class that overrides
keras.Model's `call` (a nested model's too), `train_step`, `test_step`, `predict_step`,
`compute_loss` or `compute_metrics` (each refused in one line).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import keras

from lingpipe import cluster
from lingpipe.keras import graph as graph_lib
from lingpipe.keras import graph_pipeline, model_base, preprocessing
from lingpipe.keras import plan as plan_lib
from lingpipe.pipeline.step import settings

__all__ = [
    "Pipeline",
]


# keras.Model's hooks of fit, evaluate and predict: the pipeline runs steps of its own.
_STEP_HOOKS = ("train_step", "test_step", "predict_step", "compute_loss", "compute_metrics")


def _Fresh(value: Any) -> Any:
    """A stateful compile argument (an optimizer, a metric) copied from its config; any
    other (a loss, a function, a name) as it is."""
    if isinstance(value, (keras.optimizers.Optimizer, keras.metrics.Metric)):
        return type(value).from_config(value.get_config())
    return value


def _InputSpec(model: Any) -> Any:
    functional = graph_lib._Functional(model, "lingpipe.keras.Pipeline")  # noqa: SLF001
    return keras.tree.map_structure(
        lambda t: keras.InputSpec(shape=(None, *t.shape[1:]), dtype=t.dtype),
        functional._inputs_struct,  # noqa: SLF001
    )


@keras.saving.register_keras_serializable(package="lingpipe")
@settings.Documented(
    "num_stages",
    "num_micro_batches",
    "partition",
    "schedule",
    "remat",
    "devices",
    "num_virtual_stages",
)
class Pipeline(model_base.PipelineModel):
    """A built Keras model run as a pipeline (see the module docstring).

    Args:
      model: a built Functional model or keras.Sequential; its variables move to the
        stages' devices and are this model's weights.
      split_points: names of the layers where stages 1.. begin, one fewer than the
        schedule's stages ('outer/inner' for a nested model's layer); None cuts by
        `partition` (counts are of layer calls; 'profile' times each call's forward and
        backward on one example). Up to lingpipe 0.1.0 partition defaulted to 'flops' here;
        pass partition='flops' to cut by FLOPs.
      plan: a lingpipe.keras.Plan(...) result, whose knobs this model takes, or 'auto'
        to plan here (with memory_per_device and batch_size; lingpipe.keras.plan). A
        knob given explicitly beside it wins, with a one-line warning; get_config saves
        the knobs used, not the plan.
      memory_per_device: for plan='auto': the cap per device ('16GiB', or bytes).
      batch_size: for plan='auto': the global batch of a training step.

    A compiled `model` (keras_hub's tasks compile themselves) gives a pipeline compiled
    the same way, with an optimizer of its own; compile() again to change it.
    """

    @plan_lib.RecordsGivenArguments
    def __init__(
        self,
        model: Any,
        num_stages: int = settings.DEFAULTS.num_stages,
        num_micro_batches: int = settings.DEFAULTS.num_micro_batches,
        split_points: Sequence[str] | None = None,
        partition: Any = settings.DEFAULTS.partition,
        schedule: str = settings.DEFAULTS.schedule,
        remat: str | Sequence[str] = settings.DEFAULTS.remat,
        devices: Sequence[str] | None = settings.DEFAULTS.devices,
        num_virtual_stages: int = settings.DEFAULTS.num_virtual_stages,
        plan: Any = None,
        memory_per_device: int | str | None = None,
        batch_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        graph_lib.RefuseOverrides(model, _STEP_HOOKS, "lingpipe.keras.Pipeline")
        knobs = dict(
            num_stages=num_stages,
            num_micro_batches=num_micro_batches,
            split_points=None if split_points is None else list(split_points),
            partition=partition if isinstance(partition, str) else list(partition),
            schedule=schedule,
            remat=remat,
            devices=cluster.DeviceNames(devices, "lingpipe.keras.Pipeline"),
            num_virtual_stages=num_virtual_stages,
        )
        if plan is not None or memory_per_device is not None or batch_size is not None:
            # The resolved knobs, not the plan, are what get_config saves.
            knobs = plan_lib.ResolveArgs(
                model,
                plan,
                knobs,
                self._given_arguments,
                memory_per_device,
                batch_size,
                "lingpipe.keras.Pipeline",
            )
        model_base.EnsureDevices(knobs["num_stages"], knobs["devices"], "lingpipe.keras.Pipeline")
        super().__init__(**kwargs)
        self._knobs = knobs
        object.__setattr__(self, "_model", model)  # tracked through _MakePipeline's layers
        # Keras' compile names the losses and metrics of several outputs by these.
        functional = graph_lib._Functional(model, "lingpipe.keras.Pipeline")  # noqa: SLF001
        object.__setattr__(self, "output_names", list(functional.output_names))
        self.BuildFor(_InputSpec(model))
        if getattr(model, "compiled", False) and hasattr(model, "_compile_config"):
            self._CompileAs(model)

    def _CompileAs(self, model: Any) -> None:
        """Compiles this pipeline as `model` was compiled (keras_hub's tasks compile
        themselves as they are made): compile's own arguments (a loss or metric function
        as given, registered or not), a fresh copy of its optimizer and metric objects,
        and no XLA over the step (jit_compile). Where a copy fails (an optimizer with an
        unregistered learning-rate schedule), one warning, and the pipeline is left for
        the user to compile."""
        # Keras keeps compile's arguments as given only there; its get_compile_config
        # serializes them, which a Python loss function does not survive.
        given = dict(model._compile_config.config)  # noqa: SLF001
        given.pop("jit_compile", None)
        try:
            given = keras.tree.map_structure(_Fresh, given)
        except Exception as e:  # noqa: BLE001 (any failure to copy: compile is the user's)
            first = (str(e).splitlines() or [""])[0]
            warnings.warn(
                f"{self._Where()}: the model given was compiled, and its optimizer or "
                f"metrics could not be copied ({type(e).__name__}: {first}); compile the "
                "pipeline before fit",
                stacklevel=3,
            )
            return
        self.compile(**given)

    # keras_hub's tasks preprocess their data in these (lingpipe.keras.preprocessing).
    def fit(self, *args: Any, **kwargs: Any) -> Any:
        return self._Preprocessed(super().fit, preprocessing.Fit, args, kwargs)

    def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        return self._Preprocessed(super().evaluate, preprocessing.Evaluate, args, kwargs)

    def predict(self, *args: Any, **kwargs: Any) -> Any:
        return self._Preprocessed(super().predict, preprocessing.Predict, args, kwargs)

    def _Preprocessed(self, method: Any, arguments: Any, args: tuple, kwargs: dict) -> Any:
        """`method(*args, **kwargs)`, its data first through the model's preprocessor
        where it has one (`arguments`: preprocessing.Fit, Evaluate or Predict)."""
        preprocess = preprocessing.Preprocessor(self._model)
        if preprocess is None:
            return method(*args, **kwargs)
        return method(**arguments(preprocess, args, kwargs, self._Where()))

    def train_on_batch(self, x: Any, y: Any = None, sample_weight: Any = None, **kwargs: Any):
        x, y, sample_weight = self._OneBatch(x, y, sample_weight)
        return super().train_on_batch(x, y, sample_weight, **kwargs)

    def test_on_batch(self, x: Any, y: Any = None, sample_weight: Any = None, **kwargs: Any):
        x, y, sample_weight = self._OneBatch(x, y, sample_weight)
        return super().test_on_batch(x, y, sample_weight, **kwargs)

    def predict_on_batch(self, x: Any) -> Any:
        return super().predict_on_batch(self._OneBatch(x, None, None)[0])

    def _OneBatch(self, x: Any, y: Any, sample_weight: Any) -> tuple:
        preprocess = preprocessing.Preprocessor(self._model)
        if preprocess is None:
            return x, y, sample_weight
        return keras.utils.unpack_x_y_sample_weight(preprocess(x, y, sample_weight))

    def _Where(self) -> str:
        return f"lingpipe.keras.Pipeline {self.name!r}"

    def _MakePipeline(self, input_spec: Any) -> tuple[Any, list]:
        pipeline = graph_pipeline.GraphPipeline(self._model, where=self._Where(), **self._knobs)
        return pipeline, [self._model]

    def StageLayers(self) -> list[list[keras.layers.Layer]]:
        return [
            [x for x in layers if isinstance(x, keras.layers.Layer)]
            for layers in self._pipeline.StageLayers()
        ]

    @property
    def inner_model(self) -> Any:
        """The Keras model this pipeline runs (its weights are this model's)."""
        return self._model

    def compute_output_spec(self, inputs: Any, training: bool | None = None) -> Any:
        return self._model.compute_output_spec(inputs)

    def get_config(self) -> dict:
        config = super().get_config()
        config["model"] = keras.saving.serialize_keras_object(self._model)
        # The pipeline's own compile is saved beside; the model inside is not compiled
        # again on loading (keras_hub's tasks could not be: their compile is their own).
        config["model"].pop("compile_config", None)
        return config

    @classmethod
    def from_config(cls, config: dict, custom_objects: Any = None) -> Pipeline:
        config = cls._ArgsFromConfig(config)
        # Before the inner model is rebuilt: that starts TensorFlow, after which a fresh
        # process can no longer split its CPU into the stages' logical devices.
        model_base.EnsureDevices(
            config.get("num_stages", 1), config.get("devices"), "lingpipe.keras.Pipeline"
        )
        model = keras.saving.deserialize_keras_object(
            config.pop("model"), custom_objects=custom_objects
        )
        return cls(model, **config)
