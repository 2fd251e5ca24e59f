"""KerasCell: a Keras 3 layer, or a chain of them, as a lingpipe layer (a pipeline cell).

The layers are described in params by their Keras configs, so params text stays
literal (dicts of strings and numbers) and is never run as code:

    p = KerasCell.FromKeras([keras.layers.Dense(64, activation='relu'),
                             keras.layers.LayerNormalization()], input_shape=[32])
    # or, without making Keras objects: layers=[LayerConfig('Dense', units=64), ...]
    pipe_p.cell_tpl = [p, lingpipe_block_p, ...]   # inputs: [batch, 32]

`keras.layers.deserialize` rebuilds the layers (in Keras' safe mode: a Lambda's
Python code is refused) while the cell is built, inside the device scope its
parent gives (a pipeline builds each stage's cells under the stage's device).
Each Keras weight's underlying `tf.Variable` (`keras.Variable.value`) is the
cell's variable, named after its place (`layer0_kernel`) under the cell's
path, so checkpoints key it by layer path, lingpipe's optimizers update it and
a pipeline sums its gradient per stage. FProp computes with theta, not with the
variables (`keras.StatelessScope` maps each weight to its theta entry), so the
pipeline can hand it the values of its choice. Keras dropout draws from
lingpipe's stateless seeds (the step's and micro-batch's scope, the cell's
path), so a recomputed forward draws the very same mask.

Not supported: layers with non-trainable state (BatchNormalization's moving
statistics: use lingpipe's BatchNormLayer), layers of several inputs, and custom
layers not registered with `keras.saving.register_keras_serializable`.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from lingpipe import base_layer, hyperparams, seeds
from lingpipe.nested_map import NestedMap

__all__ = [
    "GeneratorSeeds",
    "KerasCell",
    "KerasLayers",
    "LayerConfig",
    "OutputShape",
]


def LayerConfig(class_name: str, **config: Any) -> dict:
    """The config of a built-in Keras layer, made without building it: for params modules,
    which must not start TensorFlow (a Keras Dropout makes a variable when constructed).

        LayerConfig('Dense', units=64, activation='relu')  # keras.layers.Dense(64, ...)
    """
    return {"module": "keras.layers", "class_name": class_name, "config": dict(config)}


def GeneratorSeeds(layer: Any) -> list[tuple[int, Any]]:
    """(seed, state variable) of each of `layer`'s own seed generators (its variables
    that are not weights): the seed a generator was given, or drew from what
    keras.utils.set_random_seed set, when it was made. It stays the state's first entry
    as the generator draws (Keras counts in the second)."""
    weights = {id(w) for w in layer.weights}
    states = [v for v in layer.variables if id(v) not in weights]
    return [(int(keras.ops.convert_to_numpy(v)[0]), v) for v in states]


def KerasLayers(layers: Any, where: str) -> list:
    """`layers` (a Keras layer, a keras.Sequential or a list of them) as a flat list of
    Keras layers; anything else is a TypeError that names it and its place."""
    items = list(layers) if isinstance(layers, (list, tuple)) else [layers]
    out = []
    for i, layer in enumerate(items):
        if isinstance(layer, keras.Sequential):
            out.extend(layer.layers)
        elif isinstance(layer, keras.layers.Layer) and not isinstance(layer, keras.Model):
            out.append(layer)
        elif isinstance(layer, keras.Model):
            kind = "a Functional" if hasattr(layer, "_nodes_by_depth") else "a subclassed"
            raise TypeError(
                f"{where}: received {kind} keras.Model ({type(layer).__name__} "
                f"{layer.name!r}) at [{i}]: it runs its layers by its own call, not in "
                "order; pass lingpipe.keras.Pipeline(model) a Functional model, or pass "
                "model.layers here if they do run one after another"
            )
        else:
            raise TypeError(
                f"{where}: expected Keras 3 layers (keras.layers.Layer) or a keras.Sequential, "
                f"received {type(layer).__name__} at [{i}]: {layer!r:.80}"
            )
    return out


def _Deserialize(configs: Any, where: str) -> list:
    """New, unbuilt Keras layers from `configs` (a list of keras.layers.serialize dicts)."""
    if not isinstance(configs, (list, tuple)) or not configs:
        raise ValueError(
            f"{where}: expected layers to be a non-empty list of Keras layer configs "
            f"(keras.layers.serialize(layer)), received layers={configs!r:.120}"
        )
    layers = []
    for i, config in enumerate(configs):
        if not isinstance(config, dict) or "class_name" not in config:
            raise ValueError(
                f"{where}: layers[{i}] must be a Keras layer config, a dict with 'class_name' "
                f"as keras.layers.serialize(layer) gives, received {config!r:.120}"
            )
        try:
            # A copy: Keras' Lambda.from_config rewrites the config it is given.
            layer = keras.layers.deserialize(copy.deepcopy(config))
        except Exception as e:  # Keras raises TypeError, ValueError and others
            raise ValueError(
                f"{where}: layers[{i}] (class_name={config['class_name']!r}) cannot be "
                f"deserialized by keras.layers.deserialize: {e}; expected the config of a "
                "built-in Keras layer or of one registered with "
                "keras.saving.register_keras_serializable"
            ) from None
        layers.append(layer)
    return layers


def _CheckInputShape(shape: Any, where: str) -> list:
    if not isinstance(shape, (list, tuple)) or any(
        d is not None and (isinstance(d, bool) or not isinstance(d, int) or d < 1) for d in shape
    ):
        raise ValueError(
            f"{where}: expected input_shape to be the shape of one example without the batch "
            f"dim, a list of positive ints (None for a dim of any size), e.g. [32], received "
            f"input_shape={shape!r}"
        )
    return list(shape)


def OutputShape(layer: keras.layers.Layer, shape: tuple) -> Any:
    """The layer's output shape for inputs of `shape` ([batch, ...], batch may be None),
    a tuple (a structure of tuples for a layer of several outputs): Keras'
    compute_output_spec, which uses the layer's compute_output_shape where it has one
    and otherwise traces the layer on a symbolic KerasTensor."""
    spec = layer.compute_output_spec(keras.KerasTensor(shape))
    return tf.nest.map_structure(lambda t: tuple(t.shape), spec)


def _WeightName(index: int, layer: keras.layers.Layer, weight: keras.Variable) -> str:
    """'layer0_kernel' for weight 'kernel' of the cell's first layer ('layer2_query_kernel'
    for a sub-layer's). Keras' own layer names (dense_7) hang on a process-wide counter:
    they would make checkpoint keys depend on what else was built first."""
    prefix = layer.name + "/"
    path = weight.path[len(prefix) :] if weight.path.startswith(prefix) else weight.path
    return f"layer{index}_" + re.sub(r"\W", "_", path)


class KerasCell(base_layer.BaseLayer):
    """Keras layers run in order on one input: inputs [batch, *input_shape] -> outputs."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define(
            "layers",
            [],
            "Configs of the Keras layers, run in order: keras.layers.serialize(layer) dicts "
            "(KerasCell.FromKeras makes them).",
        )
        p.Define(
            "input_shape",
            None,
            "Shape of one input example, without the batch dim (e.g. [32]): the layers "
            "are built with it when the cell is.",
        )
        return p

    @classmethod
    def FromKeras(
        cls, layers: Any, input_shape: Sequence[int | None], name: str = ""
    ) -> hyperparams.InstantiableParams:
        """Params of a cell running `layers` (a Keras layer, a list, a keras.Sequential).

        The layers are templates: the cell builds its own copies from their configs
        (their weights, if built, are not copied).
        """
        templates = KerasLayers(layers, "KerasCell.FromKeras")
        configs = [keras.layers.serialize(layer) for layer in templates]
        return cls.Params().Set(name=name, layers=configs, input_shape=list(input_shape))

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        shape = (None, *_CheckInputShape(p.input_shape, self.path))
        layers = _Deserialize(p.layers, self.path)
        # The tf.Variables are named after the cell's path, as CreateVariable's are.
        with tf.init_scope():
            for i, layer in enumerate(layers):
                with tf.name_scope(f"{self.path}/layer{i}/"):
                    layer.build(shape)
                shape = OutputShape(layer, shape)
        object.__setattr__(self, "_keras_layers", layers)
        object.__setattr__(self, "_weights", [])  # (theta name, keras.Variable)
        for i, layer in enumerate(layers):
            self._AdoptWeights(i, layer)

    def _AdoptWeights(self, index: int, layer: keras.layers.Layer) -> None:
        """Makes the Keras layer's tf.Variables this cell's variables."""
        frozen = [w.name for w in layer.non_trainable_weights]
        if frozen:
            raise ValueError(
                f"{self.path}: layers[{index}] ({type(layer).__name__}) has non-trainable "
                f"weights {frozen}; a pipeline cannot update a Keras layer's state per "
                "micro-batch: use lingpipe's own layer (normalization.BatchNormLayer for "
                "batch norm)"
            )
        for weight in layer.trainable_weights:
            name = _WeightName(index, layer, weight)
            self._CheckChildName(name)
            self._private_vars[name] = weight.value
            self._var_collections[name] = []
            self._track_trackable(weight.value, name=name)
            self._weights.append((name, weight))

    @property
    def keras_layers(self) -> list:
        """The Keras layers this cell built (their weights are this cell's variables)."""
        return list(self._keras_layers)

    def _StateMapping(self, theta: NestedMap) -> list:
        """(keras.Variable, value): the weights from theta, seeds from lingpipe's scopes."""
        mapping = [(weight, theta[name]) for name, weight in self._weights]
        for i, layer in enumerate(self._keras_layers):
            trained = {id(w) for w in layer.weights}
            for j, state in enumerate(v for v in layer.variables if id(v) not in trained):
                # A seed generator's state: a stateless seed per step, micro-batch and layer.
                seed = seeds.StatelessSeed(f"{self.path}/layers_{i}_{j}", self.params.random_seed)
                mapping.append((state, tf.cast(seed, state.dtype)))
        return mapping

    def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
        """inputs: [batch, *input_shape] -> the last Keras layer's outputs [batch, ...]."""
        training = not self.do_eval
        mapping = self._StateMapping(theta)
        with keras.StatelessScope(
            mapping, initialize_variables=False, collect_losses=True
        ) as scope:
            outputs = inputs
            for layer in self._keras_layers:
                outputs = layer(outputs, training=training)
                if scope.losses:
                    raise ValueError(
                        f"{self.path}: {type(layer).__name__} {layer.name!r} adds a loss "
                        "(add_loss or an activity regularizer), which a KerasCell cannot "
                        "carry to the task's loss; use lingpipe.keras.Pipeline on a "
                        "Functional model, which adds layers' losses as Keras does"
                    )
        return outputs

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, input_shape: Any) -> NestedMap:
        """Output shape from Keras' compute_output_shape; FLOPs estimated per layer as
        2 x rows x weights + output elements (rows: output elements / last dim; exact
        for Dense and convolutions). Builds the layers in a scratch graph only."""
        where = p.name or cls.__name__
        shape = base_layer.ToShape(input_shape)
        if not shape.is_fully_defined():
            raise ValueError(f"{where}: FPropMeta needs every input dim known, received {shape}")
        shape = tuple(shape.as_list())
        flops = num_params = 0
        with tf.Graph().as_default():  # the weights are counted, not kept
            for layer in _Deserialize(p.layers, where):
                layer.build((None, *shape[1:]))
                shape = (shape[0], *OutputShape(layer, (None, *shape[1:]))[1:])
                weights = layer.count_params()
                elements = int(np.prod(shape, dtype=np.int64))
                flops += 2 * (elements // max(shape[-1], 1)) * weights + elements
                num_params += weights
        return base_layer.Meta(tf.TensorShape(shape), flops, num_params)
