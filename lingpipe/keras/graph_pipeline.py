"""GraphPipeline: a built Keras model's graph run as pipeline stages, with its own weights.

    pipe = GraphPipeline(model, num_stages=2, num_micro_batches=4)   # moves the weights
    y = pipe.FProp(pipe.theta, x)                                    # pipelined forward
    out = pipe.ForwardBackward(pipe.theta, x, loss_fn, loss_inputs)  # a training step

The graph (lingpipe.keras.graph) is cut into stages; each stage is an
`executor.Stage` whose run calls the model's own layer objects on its nodes, in
order, under a `keras.StatelessScope` that maps:
  - each trainable weight to the stage's variable (so the executor's tape sees it),
  - each seed generator's state to a stateless seed of the step, the micro-batch
    and the generator's own seed (lingpipe.seeds): a replayed forward draws the same
    dropout mask, and keras.utils.set_random_seed, or a layer's `seed`, sets the
    masks as it sets the plain model's,
  - each non-trainable weight (batch norm's moving statistics) to the value the
    previous micro-batch's forward on the stage left, in training; the forwards of
    a stage run in micro-batch order, so after the step each holds what the plain
    model run on the micro-batches one after another would leave; it is assigned
    once, after the step. Replayed forwards (recomputation) record nothing.
A layer that assigns a trainable weight in its call (SpectralNormalization in training)
is refused in one line: the stage's forwards read each weight as the step's value.

The model's variables move to their stage's device when the pipeline is made: a
weight lives where its layer is first used; a layer used on two stages (a tied
embedding) keeps one variable, and its gradient is the sum of both stages'.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import keras
import tensorflow as tf
from keras.src.backend.common import masking
from keras.src.layers import input_spec
from keras.src.models import functional as keras_functional

from lingpipe import asserts, base_layer, cluster, seeds
from lingpipe.keras import graph as graph_lib
from lingpipe.keras import graph_report
from lingpipe.layers import keras_cell
from lingpipe.nested_map import NestedMap
from lingpipe.pipeline.planning import report
from lingpipe.pipeline.schedules import generators, schedule
from lingpipe.pipeline.step import driver, executor, gradient_sums, micro_batch, settings
from lingpipe.pipeline.step import remat as remat_lib

__all__ = [
    "GraphPipeline",
]


def _Unique(items: list) -> list:
    return list({id(x): x for x in items}.values())


@settings.Documented(
    "num_stages",
    "num_micro_batches",
    "partition",
    "schedule",
    "remat",
    "devices",
    "num_virtual_stages",
)
class GraphPipeline:
    """A Keras model's graph as pipeline stages (see the module docstring).

    Args:
      model: a built Functional model or keras.Sequential (its variables are moved).
      split_points: layer names where stages 1.. begin (one fewer than the schedule's
        stages), or None to cut by `partition` (counts are of graph nodes).
      where: the caller's name in error messages.
    """

    def __init__(
        self,
        model: Any,
        num_stages: int = settings.DEFAULTS.num_stages,
        num_micro_batches: int = settings.DEFAULTS.num_micro_batches,
        split_points: Sequence[str] | None = None,
        partition: Any = settings.DEFAULTS.partition,
        schedule: str = settings.DEFAULTS.schedule,
        remat: remat_lib.Remat = settings.DEFAULTS.remat,
        devices: Sequence[str] | None = settings.DEFAULTS.devices,
        where: str = "lingpipe.keras.Pipeline",
        num_virtual_stages: int = settings.DEFAULTS.num_virtual_stages,
    ) -> None:
        self._where = where
        asserts.Positive(num_micro_batches, "num_micro_batches", where=where)
        asserts.Positive(num_virtual_stages, "num_virtual_stages", where=where)
        self._num_micro_batches, self._schedule_name = num_micro_batches, schedule
        self._num_virtual_stages = num_virtual_stages
        self._functional = graph_lib._Functional(model, where)  # noqa: SLF001
        self._graph = graph_lib.Trace(model, where)
        _RefuseStateful(model, where)
        self._devices = cluster.PipelineDevices(devices, num_stages, where)
        # The schedule places the stages (an unknown one is refused here); the graph is
        # cut into as many stages as it runs.
        sched = self._Resolve(num_micro_batches)
        self._placement = sched.stage_devices
        num_chunks, label = sched.num_stages, None
        self._remat = remat_lib.PerStage(remat, num_chunks, where=where)
        if num_chunks != num_stages:
            label = (
                f"num_stages={num_stages} x {num_chunks // num_stages} stages per device of "
                f"schedule {sched.name!r} = {num_chunks} stages"
            )
        self._cut = graph_lib.MakeCut(
            self._graph, num_chunks, partition, split_points, where, label
        )
        # The outputs are merged even from one micro-batch.
        # Embeddings' gradients reach Keras' optimizer as slices, as the plain model's do.
        self._driver = driver.Driver(
            self._devices, self._placement, self._remat, merge_one=True, sparse_grads=True
        )
        self._MoveWeights()
        self.IndexWeights()

    # ---- Construction -----------------------------------------------------------

    def StageLayers(self) -> list[list[Any]]:
        """The distinct Keras operations (layers, keras.ops) each stage calls."""
        nodes = self._graph.nodes
        return [_Unique([nodes[i].operation for i in idx]) for idx in self._cut.stages]

    def _MoveWeights(self) -> None:
        """Re-creates each Keras weight's tf.Variable on the device of the stage that
        first uses its layer (keras.Variable._initialize keeps the Keras objects)."""
        moved: set = set()
        with tf.init_scope():
            for s, layers in enumerate(self.StageLayers()):
                with tf.device(self.StageDevice(s)):
                    for layer in layers:
                        if not isinstance(layer, keras.layers.Layer):
                            continue
                        for v in layer.weights:
                            if id(v) in moved:
                                continue
                            moved.add(id(v))
                            v._initialize(  # noqa: SLF001
                                tf.Variable(v.value, trainable=v.trainable, name=v.name)
                            )

    def IndexWeights(self) -> None:
        """Per stage: its trainable weights, state (non-trainable) weights and seed states.
        Compile calls it again, as Keras reads `trainable` when a model is compiled: a base
        frozen when the pipeline was made and unfrozen since trains from then on."""
        self._trainable, self._state, self._seeds = [], [], []
        for layers in self.StageLayers():
            layers = [x for x in layers if isinstance(x, keras.layers.Layer)]
            weights = _Unique([w for x in layers for w in x.weights])
            self._trainable.append([w for w in weights if w.trainable])
            self._state.append([w for w in weights if not w.trainable])
            found = {}
            for x in layers:
                for j, (seed, v) in enumerate(keras_cell.GeneratorSeeds(x)):
                    found.setdefault(id(v), (seed, j, v))
            self._seeds.append(list(found.values()))
        # Each weight's tf.Variable, read once here: under mixed precision Keras' autocast
        # makes `.value` a cast copy while the model is called.
        self._variables = [[w.value for w in ws] for ws in self._trainable]
        self._theta = _Unique([v for vs in self._variables for v in vs])

    # ---- Introspection ----------------------------------------------------------

    @property
    def theta(self) -> list:
        """The trainable tf.Variables, each once, in stage order."""
        return list(self._theta)

    @property
    def devices(self) -> list[str]:
        return list(self._devices)

    @property
    def cut(self) -> graph_lib.Cut:
        return self._cut

    def StageDevice(self, stage: int) -> str:
        """The device of `stage`, as the schedule places it."""
        return self._devices[self._placement[stage]]

    def LayerStage(self, layer: Any) -> int:
        """The stage whose device holds `layer`'s weights."""
        return self._cut.LayerStages()[id(layer)]

    def PartitionReport(self, batch_size: int | None = None) -> report.PartitionReport:
        """Per stage: device, layer calls, params, FLOPs, the cost under the partition
        policy, and the tensors (and bytes) crossing to the next stage, per example or
        for `batch_size` (lingpipe.keras.graph_report)."""
        stage_devices = [self.StageDevice(s) for s in range(len(self._placement))]
        return graph_report.Report(self._cut, stage_devices, self._num_micro_batches, batch_size)

    def _Resolve(self, num_micro_batches: int) -> schedule.Schedule:
        try:
            return generators.Resolve(
                self._schedule_name,
                len(self._devices),
                num_micro_batches,
                self._num_virtual_stages,
            )
        except schedule.ScheduleError as e:
            raise ValueError(f"{self._where}: {e}") from None

    def Schedule(self, num_micro_batches: int) -> schedule.Schedule:
        """The schedule ForwardBackward follows for `num_micro_batches`: a name, a Schedule
        value or a CSV path (generators.Resolve), placed as the graph was cut."""
        sched = self._Resolve(num_micro_batches)
        if sched.stage_devices != self._placement:
            raise ValueError(
                f"{self._where}: schedule {sched.name!r} for num_micro_batches="
                f"{num_micro_batches} places its stages on devices {list(sched.stage_devices)}, "
                f"expected {list(self._placement)} (the placement the model was cut for)"
            )
        return sched

    # ---- Running a stage --------------------------------------------------------

    def _StageRun(self, s: int, training: bool, states: dict | None) -> Callable:
        """run(weights, live inputs) -> live outputs of stage s (see the module).

        `states` ({id(variable): (the stage that wrote it, its value)}) threads the
        non-trainable weights through the stage's forwards in training; None leaves them
        as they are (inference)."""
        graph, cut = self._graph, self._cut
        trainable, state_vars, seed_vars = self._trainable[s], self._state[s], self._seeds[s]
        seen: dict = {}  # id(input tensor): its Keras mask as this stage's forward found it

        def Run(weights: list, live: Any) -> tuple:
            live, extras = (live, {}) if s == 0 else live
            _SameMasks(tf.nest.flatten(live), seen, base_layer.IsRecomputing())
            values = dict(zip(cut.live[s], live))
            mapping = list(zip(trainable, weights))
            for generator_seed, j, v in seed_vars:
                seed = seeds.StatelessSeed(f"keras/{j}", generator_seed)
                mapping.append((v, tf.cast(seed, v.dtype)))
            record = states is not None and not base_layer.IsRecomputing()
            if record:
                mapping += [(v, states[id(v)][1]) for v in state_vars if id(v) in states]
            added = []
            with keras.StatelessScope(
                mapping, initialize_variables=False, collect_losses=True
            ) as scope:
                read = {id(w): scope.get_current_value(w) for w in trainable}
                for i in cut.stages[s]:
                    graph_lib.CallNode(graph.nodes[i], values, training)
                    # Taken after each call: a layer called again clears its earlier losses.
                    added += scope.losses
                    scope.losses[:] = []
                    self._CheckUnassigned(graph.nodes[i], scope, read)
            if record:
                for v in state_vars:
                    new = scope.get_current_value(v)
                    if new is not None:
                        self._CheckOneWriter(v, s, states.get(id(v), (s,))[0])
                        states[id(v)] = (s, new)
            outputs = tuple(values[k] for k in cut.live[s + 1])
            return outputs, self._Extras(s, extras, added, live, outputs)

        return Run

    def _CheckOneWriter(self, variable: Any, s: int, first: int) -> None:
        """Refuses state (batch norm's statistics) that layers on two stages, `first` and
        `s`, update while a step runs several micro-batches: the stages' forwards run in
        the schedule's order, not the plain model's micro-batch after micro-batch."""
        if first != s and self._num_micro_batches > 1:
            layers = self.StageLayers()[s]
            owner = [x for x in layers if any(w is variable for w in getattr(x, "weights", []))]
            name = f"{type(owner[0]).__name__} {owner[0].name!r}" if owner else "a layer"
            raise ValueError(
                f"{self._where}: {name} updates its state {variable.path!r} on stages "
                f"{first} and {s}; the stages run each micro-batch in the schedule's order, "
                "not one micro-batch after another as the plain model would; expected "
                "num_micro_batches=1, or a layer of its own on each stage"
            )

    def _CheckUnassigned(self, node: Any, scope: Any, read: dict) -> None:
        """Refuses a layer whose call assigns one of its trainable weights (Keras'
        SpectralNormalization writes the normalized kernel in training): the stage's
        forwards read each weight as the step's value (`read`, by id), so the write would
        be lost."""
        for weight in getattr(node.operation, "trainable_weights", []):
            if id(weight) in read and scope.get_current_value(weight) is not read[id(weight)]:
                layer = node.operation
                raise ValueError(
                    f"{self._where}: {type(layer).__name__} {layer.name!r} assigns its "
                    f"trainable weight {weight.path!r} in its call; a pipeline expects "
                    "trainable weights changed by the optimizer alone (each micro-batch's "
                    "forward reads the step's value, so the assignment would be lost)"
                )

    def _Extras(self, s: int, extras: dict, added: list, live: tuple, outputs: tuple) -> dict:
        """What travels beside stage s's outputs (see _PackOutputs):
        - 'layer_loss': [rows], every entry the micro-batch's losses that layers added
          (add_loss, activity regularizers) on the stages so far, summed; merged over
          micro-batches its mean is the rows-weighted mean, as the plain model's
          batch-normalized losses give on the whole batch;
        - 'masks' on the last stage: {output position: the Keras mask of that output}."""
        extras = dict(extras)
        if added:
            total = tf.add_n([tf.reduce_sum(tf.cast(x, tf.float32)) for x in added])
            carried = extras.get("layer_loss")
            if carried is None:
                carried = tf.zeros(tf.shape(tf.nest.flatten(live)[0])[:1], tf.float32)
            extras["layer_loss"] = carried + total
        if s == len(self._cut.stages) - 1:
            masks = {}
            for k in self._graph.output_keys:
                i = self._cut.live[-1].index(k)
                mask = masking.get_keras_mask(outputs[i])
                if mask is not None:
                    masks[str(i)] = mask
            if masks:
                extras["masks"] = masks
        return extras

    def _Stages(self, theta: list, training: bool, states: dict | None) -> list[executor.Stage]:
        return [
            executor.Stage(w, self._StageRun(s, training, states))
            for s, w in enumerate(self._StageWeights(theta))
        ]

    def _FlatInputs(self, inputs: Any) -> tuple:
        """The model's inputs, flat in model.inputs order and cast to their dtypes; inputs
        that do not fit the model get Keras' own message (a missing key of a dict, ...)."""
        functional = self._functional
        input_spec.assert_input_compatibility(functional.input_spec, inputs, functional.name)
        flat = tuple(functional._standardize_inputs(inputs))  # noqa: SLF001
        for x, value in zip(functional.inputs, flat):
            if isinstance(value, (tf.SparseTensor, tf.RaggedTensor)):
                ragged = isinstance(value, tf.RaggedTensor)
                dense = "x.to_tensor()" if ragged else "tf.sparse.to_dense(x)"
                raise ValueError(
                    f"{self._where}: received a tf.{type(value).__name__} for input "
                    f"{x.name!r}; expected dense tensors, which the pipeline splits into "
                    f"micro-batches by rows (pass {dense})"
                )
        return flat

    def _PackOutputs(self, last: tuple) -> tuple[Any, Any]:
        """The last stage's (outputs, extras), merged or not -> (the model's outputs, each
        with its Keras mask, the layers' losses of the batch or None)."""
        flat, extras = last
        masks = extras.get("masks", {})
        picked = []
        for k in self._graph.output_keys:
            i = self._cut.live[-1].index(k)
            if str(i) in masks:
                flat_i = tf.identity(flat[i])
                masking.set_keras_mask(flat_i, masks[str(i)])
                picked.append(flat_i)
            else:
                picked.append(flat[i])
        out = keras.tree.pack_sequence_as(
            self._functional._outputs_struct,  # noqa: SLF001
            picked,
        )
        layer_loss = extras.get("layer_loss")
        if layer_loss is not None:
            layer_loss = tf.reduce_mean(layer_loss)
        return keras_functional.unpack_singleton(out), layer_loss

    def _Sizes(self, flat: tuple) -> list:
        batch = micro_batch.BatchSize(flat, 0, self._where)
        return micro_batch.Sizes(batch, self._num_micro_batches, self._where)

    def _ApplyStates(self, states: dict) -> None:
        by_id = {id(v): v for vs in self._state for v in vs}
        for key, (_, value) in states.items():
            by_id[key].assign(value)

    # ---- The two ways to run ----------------------------------------------------

    def FProp(self, theta: list, inputs: Any) -> Any:
        """The model's outputs of FPropWithLosses (the layers' losses left out)."""
        return self.FPropWithLosses(theta, inputs)[0]

    def FPropWithLosses(self, theta: list, inputs: Any) -> tuple[Any, Any]:
        """The pipelined forward (training unless in base_layer.EvalMode) -> (outputs, the
        losses layers added (add_loss, activity regularizers) on the batch, or None).

        inputs: nested as the model's inputs, each [batch, ...] -> the model's outputs.
        In training the forwards run fill-drain as one custom gradient whose gradient
        runs the executor's backwards (each on its stage's device, replaying forwards
        as `remat` says), so a caller's own tf.GradientTape trains the pipeline, the
        layers' losses included.
        """
        flat = self._FlatInputs(inputs)
        if base_layer.DoEval():
            return self._Inference(theta, flat)
        sizes = self._Sizes(flat)
        states: dict = {}
        outputs = self._driver.Differentiable(
            list(tf.nest.flatten(theta)),
            flat,
            sizes,
            lambda weights: self._Stages(weights, True, states),
            lambda weights, result: self._SumGradients(result.weight_grads),
        )
        self._ApplyStates(states)
        return self._PackOutputs(outputs)

    def _Inference(self, theta: list, flat: tuple) -> tuple[Any, Any]:
        """The forward-only pipeline, for a batch of any size: one smaller than M (the
        last batch of predict or evaluate) is padded to M rows by repeating its last row,
        so each micro-batch holds one row and the real rows are micro-batches 0..b-1,
        and the outputs are cut back to the real rows. Rows do not meet in inference, so
        this is the plain model's result, the layers' per-row losses included."""
        m = self._num_micro_batches
        batch = micro_batch.BatchSize(flat, 0, self._where)
        if isinstance(batch, int) and batch >= m:
            outputs, _ = self._driver.Forward(
                self._Stages(theta, False, None), flat, self._Sizes(flat)
            )
            return self._PackOutputs(outputs)
        with tf.device(self._devices[0]), tf.name_scope("pad_to_micro_batches"):
            padded = micro_batch.PadToMicroBatches(flat, batch, m)
        stages = self._Stages(theta, False, None)
        outputs, _ = self._driver.Forward(stages, padded, self._Sizes(padded))
        with tf.device(self._driver.last_device), tf.name_scope("unpad"):
            outputs = tf.nest.map_structure(lambda t: t[:batch], outputs)
        return self._PackOutputs(outputs)

    def _SumGradients(self, weight_grads: list[list]) -> list:
        """Aligned with .theta: each weight's gradient summed over the stages using it."""
        sums: dict = {}
        for vs, grads in zip(self._variables, weight_grads):
            for v, g in zip(vs, grads):
                if g is not None:
                    ref = v.ref()
                    if ref in sums:  # a tied weight: summed where it lives
                        with tf.device(v.device):
                            g = gradient_sums.Add(sums[ref], g)
                    sums[ref] = g
        return [sums.get(v.ref()) for v in self._theta]

    def _StageWeights(self, theta: list) -> list[list]:
        """Stage s's values of its trainable weights, from theta (aligned with .theta)."""
        by_ref = {v.ref(): t for v, t in zip(self._theta, tf.nest.flatten(theta))}
        return [[by_ref[v.ref()] for v in vs] for vs in self._variables]

    def KeptActivations(self, sched: schedule.Schedule) -> set:
        """(stage, micro-batch) pairs whose activations are kept under remat (each stage
        under its own policy)."""
        return remat_lib.Kept(sched, self._remat)

    def ForwardBackward(
        self,
        theta: list,
        inputs: Any,
        loss_fn: Callable[[Any, Any], NestedMap],
        loss_inputs: Any = None,
        loss_scale: tf.Tensor | None = None,
    ) -> NestedMap:
        """One training step in the schedule's order (lingpipe.pipeline.step.executor).

        Args:
          theta: like .theta.
          inputs: nested as the model's inputs, each [batch, ...].
          loss_fn: (the model's outputs, the losses its layers added or None, loss
            inputs) of a micro-batch -> NestedMap of (value, weight) metrics with
            'loss', run on the last stage.
          loss_inputs: split into micro-batches beside the inputs (None: loss_fn gets None).
          loss_scale: float16's loss scale, or None: the backward starts from the scaled
            losses; the gradients returned are unscaled.

        Returns:
          NestedMap(metrics, theta_grads: aligned with theta, each weight's gradient
          summed over the stages that use it, variable_grads: {ref: grad} of variables
          loss_fn read).
        """
        flat = self._FlatInputs(inputs)
        sizes = self._Sizes(flat)
        sched, states = self.Schedule(len(sizes)), {}
        result = self._driver.Run(
            sched,
            self._Stages(theta, True, states),
            flat,
            sizes,
            lambda last, li: loss_fn(*self._PackOutputs(last), li),
            loss_inputs,
            loss_scale,
        )
        self._ApplyStates(states)
        return NestedMap(
            metrics=result.metrics,
            theta_grads=self._SumGradients(result.weight_grads),
            variable_grads=result.extra_grads,
        )


def _RefuseStateful(model: Any, where: str) -> None:
    """A stateful RNN carries each batch row's state to the next batch; the pipeline
    splits each batch into micro-batches, which that state does not fit."""
    for layer in model._flatten_layers():  # noqa: SLF001
        if getattr(layer, "stateful", False) is True:
            raise ValueError(
                f"{where}: {type(layer).__name__} {layer.name!r} is stateful: it keeps each "
                "batch row's state for the next batch, and a pipeline runs each batch as "
                "micro-batches of fewer rows; expected stateful=False"
            )


def _SameMasks(inputs: list, seen: dict, replay: bool) -> None:
    """A stage's replayed forward sees its inputs' Keras masks as its forward did.

    The stage's inputs are the tensors that the stages before it made, read again when
    the backward replays the forward, and a layer may change their masks in place:
    Keras' MultiHeadAttention deletes the masks of the tensors it is called on, as the
    plain model's later layers then see them. The forward records each input's mask
    in `seen`; the replay puts them back."""
    for t in inputs:
        if replay:
            if id(t) in seen:
                masking.set_keras_mask(t, seen[id(t)])
        else:
            seen[id(t)] = masking.get_keras_mask(t)
