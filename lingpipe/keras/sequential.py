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

Each stage rebuilds its layers from their configs, so the constructor refuses, in one
line saying what to do, a layer whose config Keras cannot turn back into a layer in
its safe mode: a `Lambda` of Python code (write a small custom layer instead), a
custom layer not registered with `keras.saving.register_keras_serializable`, or one
whose `get_config` leaves out an argument of `__init__`.

The stages are built eagerly, with explicit shapes: give `input_shape` (one
example's shape), a keras.Sequential that starts with keras.Input, or call the
model on a batch (or `model.build`) before fit/evaluate/predict.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from lingpipe import cluster
from lingpipe.keras import model_base
from lingpipe.layers import gpipe, keras_cell
from lingpipe.pipeline.step import settings

__all__ = [
    "PipelinedSequential",
]


def _SequentialInputShape(layers: Any) -> tuple | None:
    """One example's shape from a keras.Sequential that starts with keras.Input, else None."""
    if isinstance(layers, keras.Sequential) and getattr(layers, "_functional", None) is not None:
        return tuple(layers.inputs[0].shape[1:])
    return None


def _Config(layer: keras.layers.Layer) -> dict:
    """The layer's config without its build config: a built layer (one of a Sequential
    that starts with keras.Input) would otherwise come back built, and building it again
    for the stage's device fails ("cannot add new elements of state")."""
    config = dict(keras.layers.serialize(layer))
    config.pop("build_config", None)
    return config


def _Rebuilt(config: dict) -> keras.layers.Layer:
    """A new layer from `config`, left as it was: Keras' Lambda.from_config replaces the
    function's config by the function in place, and each stage rebuilds from it again."""
    return keras.layers.deserialize(copy.deepcopy(config))


_REBUILD = "(each stage builds its layers from their configs)"


def _FirstSentence(error: BaseException) -> str:
    """The first sentence of the innermost error: Keras wraps the reason in paragraphs."""
    while error.__cause__ or error.__context__:
        error = error.__cause__ or error.__context__
    text = str(error).rsplit("Exception encountered: ", 1)[-1].strip()
    return text.splitlines()[0].split(". ")[0] if text else type(error).__name__


def _IsRegistered(cls: type) -> bool:
    """Whether Keras finds `cls` by the name it serializes it under."""
    if cls.__module__.startswith("keras."):
        return True
    return keras.saving.get_registered_object(keras.saving.get_registered_name(cls)) is cls


def _Configs(layers: list, where: str) -> list[dict]:
    """Each layer's config (_Config), checked to give a layer back in Keras' safe mode;
    a layer whose config does not is refused here, before anything is built.

    Raises:
      ValueError: a Lambda of Python code, an unregistered class, a layer Keras cannot
        serialize or rebuild; one line saying why and what to do instead.
    """
    configs = []
    for i, layer in enumerate(layers):
        cls = type(layer).__name__
        at = f"{where}: layers[{i}] ({cls} {layer.name!r})"
        try:
            config = _Config(layer)
        except NotImplementedError:  # Layer.get_config's answer to arguments it cannot serialize
            raise ValueError(
                f"{at} cannot be serialized: it was made with __init__ arguments Keras cannot "
                f"serialize {_REBUILD}; give {cls} a get_config() that returns them as plain "
                "values"
            ) from None
        try:
            _Rebuilt(config)
        except Exception as e:  # noqa: BLE001 (Keras raises TypeError, ValueError and others)
            if isinstance(layer, keras.layers.Lambda):
                raise ValueError(
                    f"{where}: layers[{i}] is a Lambda layer ({layer.name!r}) of Python code, "
                    f"which Keras' safe mode refuses to rebuild from its config {_REBUILD}; "
                    "write a small custom layer instead, decorated with "
                    "@keras.saving.register_keras_serializable()"
                ) from None
            if not _IsRegistered(type(layer)):
                raise ValueError(
                    f"{at} is of a class Keras cannot find by name, so no stage can rebuild it "
                    f"from its config {_REBUILD}; decorate {cls} with "
                    "@keras.saving.register_keras_serializable()"
                ) from None
            raise ValueError(
                f"{at} cannot be rebuilt from its config {_REBUILD}: {_FirstSentence(e)}; "
                f"make {cls}.get_config() return every argument of __init__"
            ) from None
        configs.append(config)
    return configs


@keras.saving.register_keras_serializable(package="lingpipe")
@settings.Documented(
    "num_stages",
    "num_micro_batches",
    "remat",
    "schedule",
    "devices",
    "num_virtual_stages",
    "partition",
)
class PipelinedSequential(model_base.PipelineModel):
    """A keras.Model of Keras layers run in order as a pipeline (see the module docstring).

    Args:
      layers: Keras layers (or a keras.Sequential), run in order; one cell each.
      input_shape: one example's shape, without the batch dim, e.g. (784,).
    """

    def __init__(
        self,
        layers: Any,
        num_stages: int = settings.DEFAULTS.num_stages,
        num_micro_batches: int = settings.DEFAULTS.num_micro_batches,
        remat: str | Sequence[str] = settings.DEFAULTS.remat,
        schedule: str = settings.DEFAULTS.schedule,
        devices: Sequence[str] | None = settings.DEFAULTS.devices,
        num_virtual_stages: int = settings.DEFAULTS.num_virtual_stages,
        partition: Any = settings.DEFAULTS.partition,
        input_shape: Sequence[int | None] | None = None,
        **kwargs: Any,
    ) -> None:
        devices = cluster.DeviceNames(devices, "PipelinedSequential")
        model_base.EnsureDevices(num_stages, devices, "PipelinedSequential")
        super().__init__(**kwargs)
        where = f"PipelinedSequential {self.name!r}"
        templates = keras_cell.KerasLayers(layers, where)
        if not templates:
            raise ValueError(f"{where}: expected at least one Keras layer, received none")
        self._configs = _Configs(templates, where)
        # Each layer's first seed generator's seed, for its cell's stateless seeds: so
        # keras.utils.set_random_seed, or the layer's own `seed`, sets the masks.
        self._generator_seeds = [
            next(iter(keras_cell.GeneratorSeeds(t)), (None,))[0] for t in templates
        ]
        self._knobs = dict(
            num_stages=num_stages,
            num_micro_batches=num_micro_batches,
            remat=remat,
            schedule=schedule,
            devices=devices,
            num_virtual_stages=num_virtual_stages,
            partition=partition,
        )
        input_shape = input_shape if input_shape is not None else _SequentialInputShape(layers)
        if input_shape is not None:
            self.BuildFor(keras.InputSpec(shape=(None, *input_shape), dtype=self.input_dtype))

    # ---- Building ---------------------------------------------------------------

    def _CellParams(self, input_shape: tuple) -> list:
        """One KerasCell per layer, each told its input shape (chained through Keras)."""
        cells, shape = [], (None, *input_shape)
        for i, config in enumerate(self._configs):
            cells.append(
                keras_cell.KerasCell.Params().Set(
                    name=f"cell_{i}",
                    layers=[copy.deepcopy(config)],
                    input_shape=list(shape[1:]),
                    random_seed=self._generator_seeds[i],
                )
            )
            layer = _Rebuilt(config)
            with tf.Graph().as_default():  # built for its output shape only
                layer.build(shape)
                shape = keras_cell.OutputShape(layer, shape)
        return cells

    def _MakePipeline(self, input_spec: Any) -> tuple[Any, list]:
        input_shape = tuple(input_spec.shape[1:])
        knobs = dict(self._knobs)
        if knobs["partition"] in ("flops", "params"):
            knobs["input_shapes"] = [(1, *input_shape)]  # costs per example
        p = gpipe.PipeliningLayer.Params().Set(
            name="pipeline", cell_tpl=self._CellParams(input_shape), **knobs
        )
        with tf.init_scope():
            pipeline = p.Instantiate()
        return pipeline, [layer for cell in pipeline.Cells() for layer in cell.keras_layers]

    def StageLayers(self) -> list[list[keras.layers.Layer]]:
        cells = self.pipeline.Cells()
        return [
            [layer for i in idx for layer in cells[i].keras_layers]
            for idx in self.pipeline.stage_cells
        ]

    # ---- Saving -----------------------------------------------------------------

    def get_config(self) -> dict:
        config = dict(super().get_config(), layers=list(self._configs))
        spec = self.input_spec_structure
        config["input_shape"] = None if spec is None else list(spec.shape[1:])
        return config

    @classmethod
    def from_config(cls, config: dict) -> PipelinedSequential:
        config = cls._ArgsFromConfig(config)
        layers = [_Rebuilt(c) for c in config.pop("layers")]
        return cls(layers, **config)
