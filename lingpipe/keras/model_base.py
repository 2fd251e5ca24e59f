"""PipelineModel: the keras.Model that Keras pipelines (PipelinedSequential, Pipeline) share.

A subclass says how to build its pipeline; this class makes it a Keras model:

    class MyPipelined(model_base.PipelineModel):
        def __init__(self, ..., num_stages, devices=None, **kwargs):
            model_base.EnsureDevices(num_stages, devices, "MyPipelined")  # before any TF work
            super().__init__(**kwargs)
            self._knobs = dict(num_stages=num_stages, ...)  # get_config's arguments
            ...                                   # then self.BuildFor(spec) when it can
        def _MakePipeline(self, input_spec):      # -> (pipeline, Keras layers holding its weights)
        def StageLayers(self):                    # -> [[keras layer, ...] per stage]

The pipeline object has `.theta` (its variables, nested), `.devices`,
`FProp(theta, inputs)` (the pipelined forward) and `ForwardBackward(theta,
inputs, loss_fn, loss_inputs)` -> NestedMap(metrics, theta_grads,
variable_grads) (lingpipe.layers.gpipe.PipeliningLayer has exactly these). The
Keras layers returned beside it are tracked by the model, so their weights (the
pipeline's variables, on the stages' devices) are the model's weights:
`get_weights`, `save_weights`, `ModelCheckpoint` and `.keras` files see them.

What this class gives:
  - `compile` builds the optimizer eagerly, each slot beside its weight.
  - `call`, `evaluate`, `predict`: the pipelined forward (batch of any size).
  - `fit`: each batch through ForwardBackward (lingpipe.keras.step_losses): the
    compiled loss (nested outputs,
    per-output losses, loss weights, sample weights) plus the losses layers added,
    per micro-batch on the last stage, weighted by the micro-batch's rows (by its
    valid entries for a masked output), so the step's loss and gradients are those
    of the whole batch; under mixed_float16 the backward starts from the loss scaled
    as the LossScaleOptimizer scales it; metrics on the merged predictions (masks too).
  - a training batch smaller than num_micro_batches: one line before fit starts, when
    the data are arrays (evaluate and predict take batches of any size).
  - `compile(jit_compile=True)` is refused (XLA cannot span the stages' devices).
  - `export`, `tf.saved_model.save`: a serving function of the inputs' spec.
  - `summary()` adds a table of the stages: device, layers, parameters
    (`stages_table()`); `partition_report()` is the pipeline's PartitionReport
    (CamelCase `StagesTable()` and `PartitionReport()` are kept as aliases).
  - a `fit` (or evaluate, predict) that raised leaves no half-traced function behind.
"""

from __future__ import annotations

import abc
import dataclasses
import math
import os
import re
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras import tree

from lingpipe import asserts, base_layer, cluster, seeds
from lingpipe.keras import preprocessing, step_losses
from lingpipe.nested_map import NestedMap
from lingpipe.pipeline.schedules import schedule as schedule_lib
from lingpipe.pipeline.step import gradient_sums, micro_batch

__all__ = [
    "EnsureDevices",
    "PipelineModel",
]


def _ScheduleConfig(spec: Any) -> Any:
    """`schedule=` as a .keras file's JSON config holds it: a Schedule value as its CSV
    text with its name and M (_ScheduleFromConfig reads it back), a path as a string."""
    if isinstance(spec, schedule_lib.Schedule):
        csv = schedule_lib.ToCsv(spec)
        return {"name": spec.name, "csv": csv, "num_micro_batches": spec.num_micro_batches}
    return os.fspath(spec) if isinstance(spec, os.PathLike) else spec


def _ScheduleFromConfig(value: Any) -> Any:
    """The `schedule=` that _ScheduleConfig wrote."""
    if not isinstance(value, dict):
        return value
    sched = schedule_lib.FromCsv(value["csv"], value["num_micro_batches"])
    return dataclasses.replace(sched, name=value["name"])


def EnsureDevices(num_stages: int, devices: Sequence[str] | None, where: str) -> None:
    """On a machine without accelerators, splits the CPU into the logical devices the
    stages need (a fresh process loading a saved model, say); if TensorFlow has already
    started with too few, one RuntimeError that says what to call first. A num_stages
    that is not a positive integer is one ValueError."""
    asserts.Positive(num_stages, "num_stages", where=where)
    if any(tf.config.list_physical_devices(kind) for kind in ("TPU", "GPU")):
        return  # accelerators: cluster.StageDevices decides
    needed = num_stages
    if devices is not None:
        found = [re.search(r"CPU:(\d+)$", str(d)) for d in devices]
        if not all(found) or any(str(d).startswith("/job:") for d in devices):
            return  # other hosts' devices: not ours to make
        needed = max(int(m.group(1)) for m in found) + 1
    if needed <= 1:
        return
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu)
    if current is not None and len(current) >= needed:
        return
    try:
        cluster.SetLogicalCpuDevices(needed)
    except RuntimeError:
        have = len(tf.config.list_logical_devices("CPU"))
        if have >= needed:
            return
        raise RuntimeError(
            f"{where}: needs {needed} devices for its stages but this machine has no "
            f"accelerator and TensorFlow has already started with {have} CPU device(s); "
            f"call lingpipe.cluster.SetLogicalCpuDevices({needed}) at the top of the "
            f"program, before any other TensorFlow work (keras.models.load_model included)"
        ) from None


# The pipeline's message for a batch smaller than num_micro_batches (checked at trace time
# when the batch is known, else by an assertion at run time), and terminal colour codes.
_TOO_SMALL = re.compile(r"[^\s\[\]]+: [^\n\[\]]*num_micro_batches[^\n\[\]]*")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class PipelineModel(keras.Model, metaclass=abc.ABCMeta):
    """A keras.Model whose forward and training step run as a pipeline (see the module)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # tf.Modules and specs: kept out of Keras' tracking (the layers are tracked). Not
        # `_input_spec`: that is Keras' Layer.input_spec, which checks every call's dtype.
        object.__setattr__(self, "_pipeline", None)
        object.__setattr__(self, "_stage_spec", None)

    # ---- What a subclass provides --------------------------------------------------

    @abc.abstractmethod
    def _MakePipeline(self, input_spec: Any) -> tuple[Any, list]:
        """Builds the pipeline, eagerly, for inputs described by `input_spec` (a
        structure of keras.InputSpec, batch dim None). Returns (pipeline, layers): the
        Keras layers whose weights are the pipeline's variables."""

    @abc.abstractmethod
    def StageLayers(self) -> list[list[keras.layers.Layer]]:
        """The Keras layers each stage runs, stage by stage (for summary())."""

    # ---- Building ------------------------------------------------------------------

    @property
    def pipeline(self) -> Any:
        """The pipeline that runs the model (None before the model is built)."""
        return self._pipeline

    @property
    def input_spec_structure(self) -> Any:
        """The inputs' spec (keras.InputSpec, batch None) the stages were built for."""
        return self._stage_spec

    # ---- Saving --------------------------------------------------------------------

    def get_config(self) -> dict:
        """keras.Model's config and the subclass's arguments (`self._knobs`), `schedule`
        and a per-stage `remat` as JSON can hold them."""
        config = dict(super().get_config(), **self._knobs)
        config["schedule"] = _ScheduleConfig(config["schedule"])
        if not isinstance(config.get("remat", ""), str):
            config["remat"] = list(config["remat"])
        return config

    @staticmethod
    def _ArgsFromConfig(config: dict) -> dict:
        """get_config's `config` as the subclass's keyword arguments (a copy)."""
        config = dict(config)
        if "schedule" in config:
            config["schedule"] = _ScheduleFromConfig(config["schedule"])
        return config

    def BuildFor(self, input_spec: Any) -> None:
        """Builds the pipeline for `input_spec` (see _MakePipeline), then the optimizer."""
        pipeline, layers = self._MakePipeline(input_spec)
        object.__setattr__(self, "_pipeline", pipeline)
        object.__setattr__(self, "_stage_spec", input_spec)
        # Tracked by Keras: their weights (the pipeline's variables) are the model's.
        self.pipeline_layers = list(layers)
        # What Keras' export and SavedModel read for a subclassed model's signature.
        object.__setattr__(self, "_build_shapes_dict", {"input_shape": self._InputShapes()})
        self.built = True
        self._BuildOptimizer()

    def _InputShapes(self) -> Any:
        return keras.tree.map_structure(lambda s: tuple(s.shape), self._stage_spec)

    def build(self, input_shape: Any) -> None:
        """Builds the stages for inputs of `input_shape` ([batch, ...], nested as the
        inputs are), eagerly only."""
        spec = keras.tree.map_shape_structure(
            lambda s: keras.InputSpec(shape=(None, *tuple(s)[1:]), dtype=self.input_dtype),
            input_shape,
        )
        if not tf.executing_eagerly():
            self._RaiseUnbuilt(spec)
        self.BuildFor(spec)

    def _RaiseUnbuilt(self, inputs: Any) -> None:
        shapes = keras.tree.map_structure(lambda t: tuple(t.shape[1:]), inputs)
        raise ValueError(
            f"{type(self).__name__} {self.name!r}: its stages are built eagerly, with explicit "
            f"shapes, and it received none before being traced (by fit, evaluate or "
            f"predict); pass input_shape={shapes} (one example's shape), start a "
            f"keras.Sequential with keras.Input, or call the model on a batch first"
        )

    def compile(self, *args: Any, jit_compile: Any = "auto", **kwargs: Any) -> None:
        """keras.Model.compile, never XLA over the whole step (it cannot span the stages'
        devices); then, once the model is built, the optimizer's slots."""
        if jit_compile is True:
            raise ValueError(
                f"{type(self).__name__} {self.name!r}: compile(jit_compile=True) compiles "
                "the whole training step with XLA, which cannot span the stages' devices; "
                "pass jit_compile=False (or leave it out)"
            )
        if hasattr(self._pipeline, "IndexWeights"):  # the layers' `trainable` as of now
            self._pipeline.IndexWeights()
        super().compile(*args, jit_compile=False, **kwargs)
        self._BuildOptimizer()

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

        # Keras' own parameter name: Adafactor passes the weight by keyword.
        def Colocated(reference_variable: Any, *args: Any, **kwargs: Any) -> Any:
            ref = reference_variable
            with tf.device(cluster.VariableDevice(ref)):
                return keras_add(ref, *args, **kwargs)

        opt.add_variable_from_reference = Colocated  # this optimizer's build only
        placed = _EachOnItsDevice(self.trainable_variables)
        try:
            with tf.init_scope():
                opt.build(placed)
        finally:
            del opt.add_variable_from_reference
            placed.Close()

    # ---- Running -------------------------------------------------------------------

    def call(self, inputs: Any, training: bool | None = None) -> Any:
        """inputs: [batch, ...] (nested as the model's) -> outputs [batch, ...]. The losses
        the layers add (add_loss, activity regularizers) are this model's `losses`."""
        if self._pipeline is None:
            self._RaiseUnbuilt(inputs)
        pipeline = self._pipeline
        with base_layer.EvalMode(not training):
            if not hasattr(pipeline, "FPropWithLosses"):
                return (
                    self._AnyBatch(inputs)
                    if not training
                    else pipeline.FProp(pipeline.theta, inputs)
                )
            outputs, layer_loss = pipeline.FPropWithLosses(pipeline.theta, inputs)
        if layer_loss is not None:
            self.add_loss(layer_loss)
        return outputs

    def _AnyBatch(self, inputs: Any) -> Any:
        """The pipeline's inference on a batch of any size: one smaller than M (predict's
        or evaluate's last batch) is padded to M rows by repeating its last row and the
        outputs are cut back (rows do not meet in inference: the plain model's result)."""
        pipeline, m = self._pipeline, self._knobs["num_micro_batches"]
        batch = tf.shape(tree.flatten(inputs)[0])[0]
        padded = micro_batch.PadToMicroBatches(inputs, batch, m)
        outputs = pipeline.FProp(pipeline.theta, padded)
        return tree.map_structure(lambda t: t[:batch], outputs)

    def _Gradients(self, out: NestedMap) -> list:
        """The gradient of each of self.trainable_weights from ForwardBackward's result."""
        grads = dict(out.variable_grads)
        pipeline = self._pipeline
        for v, g in zip(tf.nest.flatten(pipeline.theta), tf.nest.flatten(out.theta_grads)):
            if g is not None:
                grads[v.ref()] = gradient_sums.Add(grads.get(v.ref()), g)
        return [grads.get(w.value.ref()) for w in self.trainable_weights]

    def train_step(self, data: Any) -> dict:
        """One batch through the pipeline's schedule; the compiled loss per micro-batch."""
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if self._pipeline is None:
            self._RaiseUnbuilt(x)
        self._clear_losses()  # a previous call's layer losses: the pipeline adds its own
        batch = tf.shape(tf.nest.flatten(x)[0])[0]
        predictions: list = []
        loss_fn = step_losses.LossFn(self, predictions, batch, sample_weight)
        pipeline, scale = self._pipeline, step_losses.LossScale(self.optimizer)
        if not hasattr(pipeline, "FPropWithLosses"):  # a PipeliningLayer's loss_fn
            loss_fn = lambda y_pred, micro, fn=loss_fn: fn(y_pred, None, micro)  # noqa: E731
        # Each example's row: the merged predictions keep the batch's order whatever
        # order the last stage's forwards ran in.
        loss_inputs = NestedMap(y=y, row=tf.range(batch))
        if sample_weight is not None:
            loss_inputs.sample_weight = sample_weight
        # The executor's backward of micro-batch m starts from d(loss_m rows_m * its
        # loss_scale): divided by the batch's rows, that is the plain model's scaled loss
        # restricted to the micro-batch, so float16 overflows where the plain model's would.
        executor_scale = None if scale is None else scale / tf.cast(batch, scale.dtype)
        with seeds.StepSeedScope(self.optimizer.iterations):
            out = pipeline.ForwardBackward(pipeline.theta, x, loss_fn, loss_inputs, executor_scale)
        grads = self._Gradients(out)
        if scale is not None:
            # The pipeline's backward ran on the scaled loss (so float16 kept the small
            # gradients) and unscaled its float32 sums; the LossScaleOptimizer wants them
            # scaled, as the plain model's tape gives them: it unscales, checks they are
            # finite, and skips the step (halving the scale) where they are not.
            grads = [step_losses.Scaled(g, scale) for g in grads]
        loss, _ = out.metrics.loss
        y_pred = step_losses.Stitched(predictions)
        # The loss and predictions come from forwards that no gradient needs (a recomputed
        # stage's first forward, whose backward replays it): made before the update, they
        # are the plain model's, of the weights the step started from.
        with tf.control_dependencies([loss, *tf.nest.flatten(y_pred)]):
            self.optimizer.apply(grads, self.trainable_weights)
        self._loss_tracker.update_state(loss, sample_weight=batch)
        if self._compile_loss is not None and self._compile_loss.metrics:
            self._compile_loss(y, y_pred, sample_weight)  # the per-output loss metrics
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    # ---- The user's cycle ----------------------------------------------------------

    def _DropTracedFunctions(self) -> None:
        """Forgets fit's, evaluate's and predict's traced functions: after a trace that
        raised, Keras would call the same tf.function again, which then refuses to create
        the variables its first, failed trace had begun ("Creating variables on a
        non-first call"); a fresh one traces from scratch."""
        self.train_function = self.test_function = self.predict_function = None

    def _Guarded(self, run: Any, *args: Any, **kwargs: Any) -> Any:
        """Runs Keras' fit, evaluate or predict; after an error, no traced function is
        kept, and a batch smaller than the micro-batch count is said in one line."""
        try:
            return run(*args, **kwargs)
        except (ValueError, tf.errors.InvalidArgumentError) as e:
            self._DropTracedFunctions()
            found = _TOO_SMALL.search(_ANSI.sub("", str(e)))
            if found is None:
                raise
            line = found.group(0).replace("\\'", "'")  # the run-time assertion escapes quotes
            line = line.split(": ", 1)[1]  # after the pipeline's own name for the model
            raise ValueError(f"{type(self).__name__} {self.name!r}: {line}") from None
        except BaseException:
            self._DropTracedFunctions()
            raise

    def _CheckFitBatches(self, args: tuple, kwargs: dict) -> None:
        """Before any work: arrays whose training batches would hold fewer rows than
        num_micro_batches are one ValueError line saying what to change. (A tf.data
        dataset's batches are only known as they come: checked at run time. evaluate
        and predict take batches of any size.)"""
        bound = preprocessing.Arguments(keras.Model.fit, args, kwargs)
        leaves = tree.flatten(bound.get("x"))
        if not leaves or not all(isinstance(v, (np.ndarray, tf.Tensor)) for v in leaves):
            return
        rows, batch = int(leaves[0].shape[0]), bound.get("batch_size") or 32
        split = bound.get("validation_split") or 0.0
        parts = {"fit's": int(math.ceil(rows * (1.0 - split))) if split else rows}
        needed = self._knobs["num_micro_batches"]
        for what, n in parts.items():
            first, last = min(batch, n), n % batch
            if 0 < first < needed:
                problem, fix = f"batches would hold {first} rows", f"of at least {needed}"
            elif 0 < last < needed:
                problem = f"last batch would hold {last} rows"
                fix = (
                    f"that leaves 0 or at least {needed} rows in the last batch, drop {last} rows,"
                )
            else:
                continue
            raise ValueError(
                f"{type(self).__name__} {self.name!r}: {what} {problem} ({n} rows in batches "
                f"of {batch}), fewer than num_micro_batches={needed}; pass a batch_size {fix} "
                "or lower num_micro_batches"
            )

    def fit(self, *args: Any, **kwargs: Any) -> Any:
        self._CheckFitBatches(args, kwargs)
        return self._Guarded(super().fit, *args, **kwargs)

    def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        return self._Guarded(super().evaluate, *args, **kwargs)

    def predict(self, *args: Any, **kwargs: Any) -> Any:
        return self._Guarded(super().predict, *args, **kwargs)

    def _ServingSignature(self) -> list:
        """[the inputs' structure of tf.TensorSpec (batch None)]: one positional argument."""
        if self._stage_spec is None:
            raise ValueError(
                f"{type(self).__name__} {self.name!r}: it has no stages yet, so nothing to "
                f"export; build it first (input_shape=..., or call it on a batch)"
            )

        def Spec(path: tuple, spec: keras.InputSpec) -> tf.TensorSpec:
            # Named after the input's key ('ids', 'mask'): a SavedModel signature's names.
            key = "_".join(str(p) for p in path)
            name = key if key.isidentifier() else "inputs" + (f"_{key}" if key else "")
            shape = (None, *spec.shape[1:])
            return tf.TensorSpec(shape, spec.dtype or self.input_dtype, name=name)

        flat = keras.tree.flatten_with_path(self._stage_spec)
        return [keras.tree.pack_sequence_as(self._stage_spec, [Spec(*item) for item in flat])]

    def export(
        self, filepath: Any, format: str = "tf_saved_model", verbose: Any = None, **kwargs: Any
    ) -> None:
        """keras.Model.export, with the signature of the inputs the stages were built for
        (Keras finds none for a subclassed model until it has been called)."""
        if kwargs.get("input_signature") is None:
            kwargs["input_signature"] = self._ServingSignature()
        super().export(filepath, format=format, verbose=verbose, **kwargs)

    @property
    def _default_save_signature(self) -> Any:
        """tf.saved_model.save's 'serving_default': the pipelined forward, for inference."""
        if self._stage_spec is None:
            return None

        @tf.function(input_signature=self._ServingSignature())
        def serving_default(inputs: Any) -> Any:
            return self(inputs, training=False)

        return serving_default

    def summary(self, *args: Any, print_fn: Any = None, **kwargs: Any) -> None:
        """keras.Model.summary, then a table of the stages: device, Keras layers, params."""
        super().summary(*args, print_fn=print_fn, **kwargs)
        if self._pipeline is not None:
            (print_fn or print)(self.stages_table())

    def partition_report(self, *args: Any, **kwargs: Any) -> Any:
        """The pipeline's partition report (lingpipe.pipeline.planning.report.PartitionReport; print
        it for a table): per stage its device, layers, parameters, FLOPs, the bytes sent
        to the next stage and its cost. Arguments go to the pipeline's PartitionReport:
        `batch_size=` for Pipeline (FLOPs and bytes for that batch, else per example),
        `input_shapes=` and `optimizer=` for PipelinedSequential (with a memory table)."""
        if self._pipeline is None:
            raise ValueError(
                f"{type(self).__name__} {self.name!r}: it has no stages yet, so no partition "
                f"report; build it first (input_shape=..., or call it on a batch)"
            )
        return self._pipeline.PartitionReport(*args, **kwargs)

    def PartitionReport(self, *args: Any, **kwargs: Any) -> Any:
        """partition_report (Lingvo's name, kept)."""
        return self.partition_report(*args, **kwargs)

    def StagesTable(self) -> str:
        """stages_table (Lingvo's name, kept)."""
        return self.stages_table()

    def stages_table(self) -> str:
        """One row per stage: its device, its Keras layers (by name) and their parameters."""
        rows = [("stage", "device", "params", "layers")]
        for k, layers in enumerate(self.StageLayers()):
            weights = {id(w): w for layer in layers for w in layer.weights}
            params = sum(_Size(w) for w in weights.values())
            names = ", ".join(layer.name for layer in layers)
            rows.append((str(k), self._pipeline.StageDevice(k), f"{params:,}", names))
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = ["  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3] for r in rows]
        return f"Pipeline stages of {self.name!r}:\n" + "\n".join(lines)


class _EachOnItsDevice(list):
    """The weights, as an optimizer's build walks them: each under tf.device(its device)
    while the loop's body for it runs, so a slot made without naming its weight (Keras'
    Adafactor's factored moments, made by add_variable) still sits beside it."""

    def __init__(self, weights: list) -> None:
        super().__init__(weights)
        self._walks: list = []

    def __iter__(self) -> Any:
        walk = self._Walk()
        self._walks.append(walk)
        return walk

    def _Walk(self) -> Any:
        for w in list.__iter__(self):
            with tf.device(cluster.VariableDevice(w)):
                yield w

    def Close(self) -> None:
        """Leaves the device scope of a walk that stopped early (none does in Keras)."""
        for walk in reversed(self._walks):
            walk.close()


def _Size(weight: Any) -> int:
    size = 1
    for d in weight.shape:
        size *= int(d)
    return size
