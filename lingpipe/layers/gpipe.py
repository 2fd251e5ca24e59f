"""PipeliningLayer: GPipe on TensorFlow 2.

The cells of `cell_tpl` run in order, cut into contiguous stages (chunks of the
model) on `num_stages` devices; the schedule says which device runs each stage
(stage s on device s mod K, or a V placement that gives a device both ends of
the model). Each batch is split into micro-batches that flow through the stages,
so different stages work on different micro-batches at the same time; in
backward each stage recomputes its forward from the stage-boundary activations
it kept (`remat`) and gradients are accumulated over the micro-batches. The
outputs, the loss and every gradient are those of the cells run one after
another, micro-batch by micro-batch, on one device (`FPropSequential`), to
float32 rounding.

    p = gpipe.PipeliningLayer.Params().Set(
        name='pipe', cell_tpl=[block_p] * 8, num_stages=4, num_micro_batches=8)
    pipe = p.Instantiate()
    y = pipe(x)  # x: [batch, ...], split along batch_dim (batch may be unknown until run time)
    out = pipe.ForwardBackward(pipe.theta, (x,), loss_fn)  # in p.schedule's order

Under your own tape (GradientTape or tf.gradients) `pipe(x)` runs the fill-drain
forwards as one custom gradient whose gradient runs the executor's backwards from dy;
tasks train through `ForwardBackward`, each micro-batch's loss computed on the last
stage. In eval mode FProp runs a forward-only schedule. One engine runs every path
(lingpipe.pipeline.step.executor): every op of a stage (forward, recomputation, gradient,
the accumulation of its weights' gradients) runs on its device, in that device's
order; the only cross-device traffic is the activations and their gradients between
neighbouring stages.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from lingpipe import asserts, base_layer, cluster, hyperparams, seeds
from lingpipe.layers import normalization, sequential
from lingpipe.nested_map import NestedMap
from lingpipe.pipeline.observe import memory
from lingpipe.pipeline.planning import costs, partition
from lingpipe.pipeline.planning import report as report_lib
from lingpipe.pipeline.schedules import generators, schedule
from lingpipe.pipeline.step import driver, executor, micro_batch, remat, settings, xla

__all__ = [
    "PARTITION_POLICIES",
    "PipeliningLayer",
]

PARTITION_POLICIES = settings.PARTITION_POLICIES  # the old name, kept


def _Unpacked(outputs: Any) -> Any:
    """A last cell's one output as it is, not in a tuple of one."""
    return outputs[0] if isinstance(outputs, tuple) and len(outputs) == 1 else outputs


class PipeliningLayer(base_layer.BaseLayer):
    """Runs `cell_tpl` as a GPipe pipeline over `num_stages` devices."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("cell_tpl", [], "Layer params of the cells, run in order.")
        # The knobs every front end shares: lingpipe.pipeline.step.settings declares them
        # (one call each: the docs' params table reads these calls).
        settings.Define(p, "num_stages")
        settings.Define(p, "partition")
        settings.Define(p, "devices")
        settings.Define(p, "num_micro_batches")
        p.Define(
            "micro_batch_size",
            None,
            "If set, num_micro_batches = ceil(batch / micro_batch_size) for each batch.",
        )
        p.Define("batch_dim", 0, "The dimension of the inputs that is the batch.")
        settings.Define(p, "remat")
        p.Define(
            "input_shapes",
            None,
            "Shapes (or tf.TensorSpecs) of FProp's positional inputs for a whole batch: "
            "needed by partition 'flops', 'params' and 'profile'; also used by "
            "PartitionReport() before the first call.",
        )
        p.Define("profile_repeats", 3, "Timed runs per cell for partition='profile'.")
        settings.Define(p, "schedule")
        settings.Define(p, "jit_compile_stages")
        settings.Define(p, "num_virtual_stages")
        return p

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        cells = self._CheckCells(p.cell_tpl)
        asserts.Positive(p.num_stages, "num_stages", where=self.path)
        asserts.Positive(p.num_virtual_stages, "num_virtual_stages", where=self.path)
        asserts.Positive(p.num_micro_batches, "num_micro_batches", where=self.path)
        if p.micro_batch_size is not None:
            asserts.Positive(p.micro_batch_size, "micro_batch_size", where=self.path)
        asserts.Ge(p.batch_dim, 0, "batch_dim", where=self.path)
        self._placement = self._CheckSchedule()
        num_chunks = self._placement.num_stages
        per_stage = remat.PerStage(p.remat, num_chunks, where=self.path)
        if num_chunks > len(cells):
            chunks, unit = f"num_stages={p.num_stages}", "stage"
            if num_chunks > p.num_stages:
                virtual = f"num_virtual_stages={num_chunks // p.num_stages}"
                chunks, unit = f"{chunks} x {virtual} = {num_chunks} chunks", "chunk"
            raise ValueError(
                f"{self.path}: {chunks} is greater than the number of cells ({len(cells)} in "
                f"cell_tpl); every {unit} needs at least one cell"
            )
        self._devices = cluster.PipelineDevices(p.devices, p.num_stages, self.path)
        stage_devices = self._placement.stage_devices
        self._driver = driver.Driver(self._devices, stage_devices, per_stage, p.batch_dim)
        self._metas = costs.CellMetas(p, cells, tuple(p.input_shapes)) if p.input_shapes else None
        self._cell_costs = self._CellCosts(cells)
        self._counts = self._Partition(num_chunks)
        self._stage_cells = [list(range(*ends)) for ends in partition.Boundaries(self._counts)]
        for s, idx in enumerate(self._stage_cells):
            with tf.device(self.StageDevice(s)):
                for i in idx:
                    self.CreateChild(f"cell_{i}", cells[i])
        object.__setattr__(self, "_seen_shapes", None)
        if p.jit_compile_stages:
            self._CheckCompilable()

    # ---- Construction helpers ----------------------------------------------

    def _CheckCells(self, cell_tpl: Any) -> list:
        if isinstance(cell_tpl, hyperparams.Params) or not isinstance(cell_tpl, (list, tuple)):
            raise ValueError(
                f"{self.path}: expected cell_tpl to be a list of layer params, received "
                f"{type(cell_tpl).__name__}"
            )
        if not cell_tpl:
            raise ValueError(f"{self.path}: cell_tpl is empty; give at least one cell")
        for i, c in enumerate(cell_tpl):
            if not base_layer.IsLayerParams(c):
                raise ValueError(
                    f"{self.path}: cell_tpl[{i}] is not the params of a layer, received "
                    f"{type(c).__name__}"
                )
        return list(cell_tpl)

    def _CellCosts(self, cells: list) -> list[float]:
        p = self.params
        policy = p.partition
        if isinstance(policy, str):
            hint = "or give a list of cell counts per stage"
            asserts.In(policy, PARTITION_POLICIES, "partition", where=self.path, hint=hint)
        if policy == "uniform" or not isinstance(policy, str):
            return [1.0] * len(cells)
        if not p.input_shapes:
            raise ValueError(
                f"{self.path}: partition={policy!r} needs input_shapes (the shapes of "
                f"FProp's inputs) to measure the cells; set p.input_shapes"
            )
        return costs.PolicyCosts(
            policy,
            len(cells),
            flops=lambda: [m.flops for m in self._metas],
            params=lambda: [m.num_params for m in self._metas],
            profile=lambda: costs.ProfileCellTimes(
                p, cells, tuple(p.input_shapes), p.profile_repeats
            ),
        )

    def _CheckSchedule(self) -> schedule.Schedule:
        """p.schedule for some M, refused here if it cannot run these devices: its
        placement cuts the cells (M is checked again at each call)."""
        p = self.params
        micro = p.num_micro_batches
        if p.micro_batch_size is not None:  # M known only at each call
            micro = p.num_stages
            if isinstance(p.schedule, schedule.Schedule):
                micro = p.schedule.num_micro_batches
            elif generators.IsCsvPath(p.schedule):
                try:
                    micro = schedule.FromCsvFile(p.schedule, argument="schedule").num_micro_batches
                except schedule.ScheduleError as e:
                    raise ValueError(f"{self.path}: {e}") from None
        return self.Schedule(micro)

    def _Partition(self, num_chunks: int) -> list[int]:
        try:
            return partition.Counts(self.params.partition, self._cell_costs, num_chunks)
        except ValueError as e:
            raise ValueError(f"{self.path}: {e}") from None

    def _CheckCompilable(self) -> None:
        """Refuses jit_compile_stages for cells with batch norm: their statistics are
        recorded as tensors of the stage's function and would leak out of it."""
        for i, cell in enumerate(self.Cells()):
            for layer in [cell, *cell.Descendants()]:
                if isinstance(layer, normalization.BatchNormLayer):
                    raise ValueError(
                        f"{self.path}: jit_compile_stages=True cannot compile {layer.path} "
                        f"(BatchNormLayer in cell_{i}): its batch statistics leave the stage's "
                        "function; set jit_compile_stages=False or use LayerNorm"
                    )

    # ---- Introspection ------------------------------------------------------

    @property
    def devices(self) -> list[str]:
        return list(self._devices)

    @property
    def stage_cells(self) -> list[list[int]]:
        """Indices of the cells of each stage (each chunk, when interleaved)."""
        return [list(c) for c in self._stage_cells]

    def StageDevice(self, stage: int) -> str:
        """The device of `stage` (-1: the last), as the schedule places it."""
        return self._devices[self._placement.DeviceOf(stage)]

    @property
    def cell_costs(self) -> list[float]:
        """Each cell's cost under the partition policy (seconds for 'profile')."""
        return list(self._cell_costs)

    def Cells(self) -> list[base_layer.BaseLayer]:
        return [getattr(self, f"cell_{i}") for i in range(len(self.params.cell_tpl))]

    def PartitionReport(
        self, input_shapes: Sequence[Any] | None = None, optimizer: Any = None
    ) -> report_lib.PartitionReport:
        """Per stage: device, cells, parameters, FLOPs, boundary activation bytes and the
        estimated memory of a training step under p.schedule and p.remat (see
        lingpipe.pipeline.observe.memory; `optimizer`: its params, or slots per weight). FLOPs,
        boundary bytes and memory need the inputs' shapes: `input_shapes`, else
        p.input_shapes, else the shapes of the last FProp."""
        p = self.params
        shapes = input_shapes or p.input_shapes or self._seen_shapes
        shapes = None if shapes is None else tuple(shapes)
        metas = self._metas  # of p.input_shapes, chained in __init__
        if shapes is not None and (metas is None or input_shapes):
            metas = costs.CellMetas(p, p.cell_tpl, shapes)
        batch = None if shapes is None else base_layer.NormShape(tf.nest.flatten(shapes)[0])
        micro = self._NumMicroBatches(None if batch is None else batch[p.batch_dim])
        stages = []
        for k, idx in enumerate(self._stage_cells):
            cells = [getattr(self, f"cell_{i}") for i in idx]
            boundary = None
            if metas is not None:
                boundary = costs.ShapeBytes(metas[idx[-1]].out_shapes, self.fprop_dtype)
                boundary = -(-boundary // micro)
            stages.append(
                report_lib.StageReport(
                    stage=k,
                    device=self.StageDevice(k),
                    cells=[c.path for c in cells],
                    # All variables, as FPropMeta counts them (batch norm's moving stats too).
                    num_params=sum(int(v.shape.num_elements()) for c in cells for v in c.variables),
                    flops=None if metas is None else sum(metas[i].flops for i in idx),
                    boundary_bytes=boundary,
                    cost=sum(self._cell_costs[i] for i in idx),
                )
            )
        policy = p.partition if isinstance(p.partition, str) else f"explicit {self._counts}"
        report = report_lib.PartitionReport(policy, micro, stages)
        if shapes is not None:
            sched = self.Schedule(micro)
            kept = self.KeptActivations(sched)
            report.AddMemory(
                lambda: memory.Estimate(
                    p, p.cell_tpl, self._stage_cells, shapes, sched, kept, optimizer, p.batch_dim
                ),
                memory.Note(sched, p.remat, optimizer),
            )
        return report

    # ---- Computation --------------------------------------------------------

    def _NumMicroBatches(self, batch: micro_batch.Size | None) -> int:
        p = self.params
        if p.micro_batch_size is None or not batch:  # not batch: unknown in PartitionReport
            return p.num_micro_batches
        return -(-batch // p.micro_batch_size)

    def _Sizes(self, args: tuple) -> list[micro_batch.Size]:
        """Micro-batch sizes for these inputs (validates the batch)."""
        p = self.params
        batch = micro_batch.BatchSize(args, p.batch_dim, self.path)
        shapes = tf.nest.map_structure(lambda t: getattr(t, "shape", None), args)
        object.__setattr__(self, "_seen_shapes", shapes)  # for PartitionReport; not tracked
        if p.micro_batch_size is not None and not isinstance(batch, int):
            raise ValueError(
                f"{self.path}: micro_batch_size={p.micro_batch_size} needs a batch size known "
                "at trace time, received a batch of unknown size (None); set "
                "num_micro_batches instead, or give the inputs a static batch"
            )
        return micro_batch.Sizes(batch, self._NumMicroBatches(batch), self.path)

    def _RunCells(self, indices: Sequence[int], theta: NestedMap, args: Any) -> Any:
        """Runs cells `indices` (theta: theta.cell_i for each) in order; checks each
        output fits the next cell's FProp."""
        outputs = args
        for i in indices:
            cell = getattr(self, f"cell_{i}")
            inputs = sequential.AsArgs(outputs)
            try:
                inspect.signature(cell.FProp).bind(theta[f"cell_{i}"], *inputs)
            except TypeError as e:
                given = "the pipeline's inputs" if i == 0 else f"cell_{i - 1}'s outputs"
                described = tf.nest.map_structure(micro_batch.Describe, inputs)
                raise ValueError(
                    f"{self.path}: cell_{i} ({type(cell).__name__}) cannot take {given}: "
                    f"{len(inputs)} value(s) {described} for "
                    f"FProp{inspect.signature(cell.FProp)} ({e})"
                ) from None
            outputs = cell.FProp(theta[f"cell_{i}"], *inputs)
        return outputs

    def FProp(self, theta: NestedMap, *args: Any) -> Any:
        """The pipelined forward.

        Args:
          theta: this layer's theta (cell_0 .. cell_{N-1}).
          *args: the first cell's inputs. Every leaf with the batch along batch_dim (the
            size most leaves share: micro_batch.BatchSize) is split into micro-batches,
            every other leaf (scalars, tables, a [d] vector when d != batch) goes whole to
            each micro-batch. A per-model leaf whose size happens to equal the batch would
            be split: give it another shape.

        Returns:
          The last cell's outputs for the whole batch, micro-batches merged in order.
        """
        sizes = self._Sizes(args)
        if self.do_eval:
            return _Unpacked(self._driver.Forward(self._Stages(theta), args, sizes)[0])
        with normalization.BatchNormStats() as stats:
            outputs = self._driver.Differentiable(
                theta, args, sizes, self._Stages, self._ThetaGrads
            )
        stats.Apply()
        return _Unpacked(outputs)

    def _StageThetas(self, theta: NestedMap) -> list[NestedMap]:
        return [
            NestedMap({f"cell_{i}": theta[f"cell_{i}"] for i in idx}) for idx in self._stage_cells
        ]

    def _Stages(self, theta: NestedMap) -> list[executor.Stage]:
        return [
            executor.Stage(tf.nest.flatten(th), self._StageFn(idx, th))
            for idx, th in zip(self._stage_cells, self._StageThetas(theta))
        ]

    def _ThetaGrads(self, theta: NestedMap, result: executor.Result) -> NestedMap:
        """Like theta: each leaf's gradient from its stage's weight gradients."""
        grads = NestedMap()
        for th, stage_grads in zip(self._StageThetas(theta), result.weight_grads):
            grads.update(tf.nest.pack_sequence_as(th, stage_grads))
        return NestedMap({k: grads[k] for k in theta})

    # ---- The schedule's executor ------------------------------------------------

    def Schedule(self, num_micro_batches: int | None = None) -> schedule.Schedule:
        """The schedule ForwardBackward follows for `num_micro_batches` (default the params')."""
        p = self.params
        micro = num_micro_batches or p.num_micro_batches
        try:
            return generators.Resolve(p.schedule, p.num_stages, micro, p.num_virtual_stages)
        except schedule.ScheduleError as e:
            raise ValueError(f"{self.path}: {e}") from None

    def KeptActivations(self, sched: schedule.Schedule) -> set[tuple[int, int]]:
        """The (stage, micro-batch) pairs whose activations p.remat keeps (remat.Kept),
        each stage under its own policy when p.remat gives one per stage."""
        return remat.Kept(sched, self.params.remat)

    def ForwardBackward(
        self,
        theta: NestedMap,
        inputs: Any,
        loss_fn: Callable[[Any, Any], NestedMap],
        loss_inputs: Any = None,
        loss_scale: tf.Tensor | None = None,
    ) -> NestedMap:
        """One training step's forward and backward, in the order of `p.schedule` (the
        executor creates the backward itself, so the schedule decides its order).

        Args:
          theta: this layer's theta (cell_0 .. cell_{N-1}).
          inputs: the first cell's inputs: a tuple of FProp's positional args, or one value.
          loss_fn: (outputs, loss_inputs) of one micro-batch -> NestedMap of (value,
            weight) metrics with 'loss' (scalars), run on the last stage's device.
          loss_inputs: a structure split into micro-batches with the inputs (the
            task's input batch, say) and handed to loss_fn; None gives loss_fn None.
          loss_scale: float16's loss scale (a float scalar), or None: the backward
            starts from the scaled losses; the gradients returned are unscaled.

        Returns:
          NestedMap(metrics: the weighted means of loss_fn's metrics over the
          micro-batches, theta_grads: like theta, the gradient of the batch's loss,
          input_grads: like inputs (None where not floating point),
          variable_grads: {variable.ref(): gradient} of variables loss_fn read).
        """
        args = inputs if isinstance(inputs, tuple) else (inputs,)
        sizes = self._Sizes(args)
        sched, stages = self.Schedule(len(sizes)), self._Stages(theta)
        with normalization.BatchNormStats() as stats:
            result = self._driver.Run(sched, stages, args, sizes, loss_fn, loss_inputs, loss_scale)
        stats.Apply()
        batch_dim = self.params.batch_dim
        input_grads = micro_batch.MergeGradients(result.input_grads, args, sizes, batch_dim)
        return NestedMap(
            metrics=result.metrics,
            theta_grads=self._ThetaGrads(theta, result),
            input_grads=input_grads if isinstance(inputs, tuple) else input_grads[0],
            variable_grads=result.extra_grads,
        )

    def _StageFn(self, idx: list[int], theta: NestedMap) -> Callable[[list, Any], Any]:
        def Run(weights: list, inputs: Any) -> Any:
            return self._RunCells(idx, tf.nest.pack_sequence_as(theta, weights), inputs)

        return xla.Compiled(Run) if self.params.jit_compile_stages else Run

    def FPropSequential(self, theta: NestedMap, *args: Any) -> Any:
        """The reference the pipeline must equal (module doc): the same cells and
        micro-batches one after another, no devices; batch norm statistics accumulate
        the same way."""
        p = self.params
        sizes = self._Sizes(args)
        micro_args = micro_batch.Split(args, sizes, p.batch_dim)
        with normalization.BatchNormStats() as stats:
            outputs = []
            for m, a in enumerate(micro_args):
                with seeds.StepSeedScope(m):
                    outputs.append(self._RunCells(range(len(p.cell_tpl)), theta, a))
        stats.Apply()
        return outputs[0] if len(sizes) == 1 else micro_batch.Merge(outputs, sizes, p.batch_dim)

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, *input_shapes: Any) -> NestedMap:
        return sequential.ChainMeta(p, p.cell_tpl, input_shapes)
