"""PipeliningLayer: GPipe on TensorFlow 2.

The cells of `cell_tpl` run in order, cut into `num_stages` contiguous stages on
`num_stages` devices. Each batch is split into micro-batches that flow through
the stages in the fill-drain schedule, so different stages work on different
micro-batches at the same time; in backward each stage recomputes its forward
from the stage-boundary activations it kept (`remat`) and gradients are
accumulated over the micro-batches. The outputs, the loss and every gradient are
those of the cells run one after another, micro-batch by micro-batch, on one
device (`FPropSequential`), to float32 rounding.

    p = gpipe.PipeliningLayer.Params().Set(
        name='pipe', cell_tpl=[block_p] * 8, num_stages=4, num_micro_batches=8)
    pipe = p.Instantiate()
    y = pipe(x)  # x: [batch, ...], split along batch_dim

Every op of stage k (forward, recomputation, gradient, the accumulation of its
weights' gradients) runs on device k, whether gradients are taken with
tf.GradientTape or tf.gradients; the only cross-device traffic is the
activations and their gradients between neighbouring stages.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from lingpipe import asserts, base_layer, cluster, hyperparams, seeds
from lingpipe.layers import normalization, sequential
from lingpipe.nested_map import NestedMap
from lingpipe.pipeline import costs, micro_batch, partition, schedule
from lingpipe.pipeline import report as report_lib
from lingpipe.pipeline.stage_call import GradientAccumulator, PlainCall, StageCall

PARTITION_POLICIES = ("uniform", "flops", "params", "profile")
REMAT_POLICIES = ("always", "except_last", "never")


class PipeliningLayer(base_layer.BaseLayer):
    """Runs `cell_tpl` as a GPipe pipeline over `num_stages` devices."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("cell_tpl", [], "Layer params of the cells, run in order.")
        p.Define("num_stages", 1, "Number of pipeline stages, one device each.")
        p.Define(
            "partition",
            "uniform",
            "How cells are cut into stages: 'uniform' (cell count), 'flops' and 'params' "
            "(from FPropMeta, needs input_shapes), 'profile' (measured forward+backward "
            "time per cell, needs input_shapes), or a list of cell counts per stage.",
        )
        p.Define(
            "devices",
            None,
            "Device names, one per stage; None takes the first num_stages devices of "
            "the cluster (accelerators first).",
        )
        p.Define("num_micro_batches", 1, "Micro-batches each batch is split into.")
        p.Define(
            "micro_batch_size",
            None,
            "If set, num_micro_batches = ceil(batch / micro_batch_size) for each batch.",
        )
        p.Define("batch_dim", 0, "The dimension of the inputs that is the batch.")
        p.Define(
            "remat",
            "always",
            "Recompute each stage's forward in backward: 'always', 'except_last' (not for "
            "the last micro-batch, which is differentiated first), or 'never'.",
        )
        p.Define(
            "input_shapes",
            None,
            "Shapes (or tf.TensorSpecs) of FProp's positional inputs for a whole batch: "
            "needed by partition 'flops', 'params' and 'profile'; also used by "
            "PartitionReport() before the first call.",
        )
        p.Define("profile_repeats", 3, "Timed runs per cell for partition='profile'.")
        return p

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        cells = self._CheckCells(p.cell_tpl)
        asserts.Positive(p.num_stages, "num_stages", where=self.path)
        if p.num_stages > len(cells):
            raise ValueError(
                f"{self.path}: num_stages={p.num_stages} is greater than the number of "
                f"cells ({len(cells)} in cell_tpl); every stage needs at least one cell"
            )
        asserts.Positive(p.num_micro_batches, "num_micro_batches", where=self.path)
        if p.micro_batch_size is not None:
            asserts.Positive(p.micro_batch_size, "micro_batch_size", where=self.path)
        asserts.In(p.remat, REMAT_POLICIES, "remat", where=self.path)
        asserts.Ge(p.batch_dim, 0, "batch_dim", where=self.path)
        self._devices = self._ResolveDevices(p.devices, p.num_stages)
        self._metas = costs.CellMetas(p, cells, tuple(p.input_shapes)) if p.input_shapes else None
        self._cell_costs = self._CellCosts(cells)
        self._counts = self._Partition(cells)
        self._stage_cells: list[list[int]] = []
        for k, (start, end) in enumerate(partition.Boundaries(self._counts)):
            self._stage_cells.append(list(range(start, end)))
            with tf.device(self._devices[k]):
                for i in range(start, end):
                    self.CreateChild(f"cell_{i}", cells[i])
        self._num_cells = len(cells)
        object.__setattr__(self, "_seen_shapes", None)

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
            if not isinstance(c, hyperparams.InstantiableParams) or not (
                isinstance(c.cls, type) and issubclass(c.cls, base_layer.BaseLayer)
            ):
                raise ValueError(
                    f"{self.path}: cell_tpl[{i}] is not the params of a layer, received "
                    f"{type(c).__name__}"
                )
        return list(cell_tpl)

    def _ResolveDevices(self, devices: Any, num_stages: int) -> list[str]:
        if devices is None:
            try:
                return cluster.StageDevices(num_stages)
            except ValueError as e:
                raise ValueError(f"{self.path}: num_stages={num_stages}: {e}") from None
        devices = list(devices)
        if len(devices) != num_stages:
            raise ValueError(
                f"{self.path}: expected one device per stage, received {len(devices)} "
                f"device(s) {devices} for num_stages={num_stages}"
            )
        try:
            return [cluster.CanonicalDevice(d) for d in devices]
        except ValueError as e:
            raise ValueError(f"{self.path}: {e}") from None

    def _CellCosts(self, cells: list) -> list[float]:
        p = self.params
        policy = p.partition
        if not isinstance(policy, str):
            return [1.0] * len(cells)
        asserts.In(
            policy,
            PARTITION_POLICIES,
            "partition",
            where=self.path,
            hint="or give a list of cell counts per stage",
        )
        if policy == "uniform":
            return [1.0] * len(cells)
        if not p.input_shapes:
            raise ValueError(
                f"{self.path}: partition={policy!r} needs input_shapes (the shapes of "
                f"FProp's inputs) to measure the cells; set p.input_shapes"
            )
        if policy == "flops":
            return [float(m.flops) for m in self._metas]
        if policy == "params":
            return [float(m.num_params) for m in self._metas]
        return costs.ProfileCells(p, cells, tuple(p.input_shapes), p.profile_repeats)

    def _Partition(self, cells: list) -> list[int]:
        p = self.params
        if isinstance(p.partition, str):
            return partition.MinMaxPartition(self._cell_costs, p.num_stages)
        try:
            return partition.CheckCounts(p.partition, len(cells), p.num_stages)
        except ValueError as e:
            raise ValueError(f"{self.path}: {e}") from None

    # ---- Introspection ------------------------------------------------------

    @property
    def devices(self) -> list[str]:
        return list(self._devices)

    @property
    def stage_cells(self) -> list[list[int]]:
        """Indices of the cells of each stage."""
        return [list(c) for c in self._stage_cells]

    @property
    def cell_costs(self) -> list[float]:
        """Each cell's cost under the partition policy (seconds for 'profile')."""
        return list(self._cell_costs)

    def Cells(self) -> list[base_layer.BaseLayer]:
        return [getattr(self, f"cell_{i}") for i in range(self._num_cells)]

    def PartitionReport(
        self, input_shapes: Sequence[Any] | None = None
    ) -> report_lib.PartitionReport:
        """Per stage: device, cells, parameters, FLOPs and boundary activation bytes.

        FLOPs and boundary bytes need the inputs' shapes: `input_shapes`, else
        p.input_shapes, else the shapes of the last FProp.
        """
        p = self.params
        shapes = input_shapes or p.input_shapes or self._seen_shapes
        metas = self._metas
        if shapes is not None and (metas is None or input_shapes):
            metas = costs.CellMetas(p, p.cell_tpl, tuple(shapes))
        micro = p.num_micro_batches
        if shapes is not None:
            batch = sequential.NormShape(tf.nest.flatten(tuple(shapes))[0])[p.batch_dim]
            micro = self._NumMicroBatches(batch) if batch else p.num_micro_batches
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
                    device=self._devices[k],
                    cells=[c.path for c in cells],
                    # All variables, as FPropMeta counts them (batch norm's moving stats too).
                    num_params=sum(int(v.shape.num_elements()) for c in cells for v in c.variables),
                    flops=None if metas is None else sum(metas[i].flops for i in idx),
                    boundary_bytes=boundary,
                    cost=sum(self._cell_costs[i] for i in idx),
                )
            )
        policy = p.partition if isinstance(p.partition, str) else f"explicit {self._counts}"
        return report_lib.PartitionReport(policy, micro, stages)

    # ---- Computation --------------------------------------------------------

    def _NumMicroBatches(self, batch: int) -> int:
        p = self.params
        if p.micro_batch_size is not None:
            return -(-batch // p.micro_batch_size)
        return p.num_micro_batches

    def _Sizes(self, args: tuple) -> list[int]:
        """Micro-batch sizes for these inputs (validates the batch)."""
        batch = micro_batch.BatchSize(args, self.params.batch_dim, self.path)
        shapes = tf.nest.map_structure(lambda t: getattr(t, "shape", None), args)
        object.__setattr__(self, "_seen_shapes", shapes)  # for PartitionReport; not tracked
        return micro_batch.Sizes(batch, self._NumMicroBatches(batch), self.path)

    def _RunCells(self, indices: Sequence[int], thetas: Sequence[NestedMap], args: tuple) -> Any:
        """Runs cells `indices` in order; checks each output fits the next cell's FProp."""
        outputs = args
        for i, theta in zip(indices, thetas):
            cell = getattr(self, f"cell_{i}")
            inputs = sequential.AsArgs(outputs)
            try:
                inspect.signature(cell.FProp).bind(theta, *inputs)
            except TypeError as e:
                given = "the pipeline's inputs" if i == 0 else f"cell_{i - 1}'s outputs"
                described = tf.nest.map_structure(micro_batch.Describe, inputs)
                raise ValueError(
                    f"{self.path}: cell_{i} ({type(cell).__name__}) cannot take {given}: "
                    f"{len(inputs)} value(s) {described} for "
                    f"FProp{inspect.signature(cell.FProp)} ({e})"
                ) from None
            outputs = cell.FProp(theta, *inputs)
        return outputs

    def FProp(self, theta: NestedMap, *args: Any) -> Any:
        """The pipelined forward.

        Args:
          theta: this layer's theta (cell_0 .. cell_{N-1}).
          *args: the first cell's inputs. The batch is the size along batch_dim of the
            first leaf that has one; every leaf with that size along batch_dim is split
            into micro-batches, every other leaf (scalars, tables, a [d] vector when
            d != batch) goes whole to each micro-batch. A per-model leaf whose size
            happens to equal the batch would be split: give it another shape.

        Returns:
          The last cell's outputs for the whole batch, micro-batches merged in order.
        """
        if self.do_eval:
            return self._Pipeline(theta, args, training=False)
        with normalization.BatchNormStats() as stats:
            outputs = self._Pipeline(theta, args, training=True)
        stats.Apply()
        return outputs

    def _Pipeline(self, theta: NestedMap, args: tuple, training: bool) -> Any:
        p = self.params
        sizes = self._Sizes(args)
        num_micro, num_stages = len(sizes), p.num_stages
        devices = self._devices

        def Call(fn, inputs, k, name, recompute=False, after=(), accumulator=None):
            if training:
                return StageCall(fn, inputs, devices[k], recompute, after, name, accumulator)
            return PlainCall(fn, inputs, devices[k], after, name)

        split = lambda *a: micro_batch.Split(a, sizes, p.batch_dim)  # noqa: E731
        micro_args = Call(split, args, 0, "stage0_split") if num_micro > 1 else [args]
        # The micro-batches of a stage share its weights; one accumulator per stage
        # sums their gradient on the stage's device, one micro-batch at a time.
        thetas = [[theta[f"cell_{i}"] for i in idx] for idx in self._stage_cells]
        accumulators = [GradientAccumulator(num_micro) for _ in range(num_stages)]

        state = list(micro_args)
        last_out: list[Any] = [None] * num_stages
        for tick in schedule.FillDrain(num_stages, num_micro):
            for k, m in tick:
                recompute = p.remat == "always" or (p.remat == "except_last" and m < num_micro - 1)
                idx = self._stage_cells[k]
                run = lambda th, a, idx=idx: self._RunCells(idx, th, a)  # noqa: E731
                after = [] if last_out[k] is None else tf.nest.flatten(last_out[k])[:1]
                with seeds.StepSeedScope(m):
                    out = Call(
                        run,
                        (thetas[k], state[m]),
                        k,
                        f"stage{k}_mb{m}",
                        recompute,
                        after,
                        accumulators[k],
                    )
                state[m] = sequential.AsArgs(out)
                last_out[k] = out
        outputs = [s[0] if len(s) == 1 else s for s in state]
        if num_micro == 1:
            return outputs[0]
        merge = lambda *outs: micro_batch.Merge(list(outs), sizes, p.batch_dim)  # noqa: E731
        return Call(merge, tuple(outputs), num_stages - 1, f"stage{num_stages - 1}_merge")

    def FPropSequential(self, theta: NestedMap, *args: Any) -> Any:
        """The reference: the same cells and micro-batches, one after another, no devices.

        What the pipeline must equal: same outputs, loss and gradients (rounding
        aside), batch norm statistics accumulated the same way.
        """
        p = self.params
        sizes = self._Sizes(args)
        micro_args = micro_batch.Split(args, sizes, p.batch_dim)
        indices = list(range(self._num_cells))
        thetas = [theta[f"cell_{i}"] for i in indices]
        with normalization.BatchNormStats() as stats:
            outputs = []
            for m, a in enumerate(micro_args):
                with seeds.StepSeedScope(m):
                    outputs.append(self._RunCells(indices, thetas, a))
        stats.Apply()
        return outputs[0] if len(sizes) == 1 else micro_batch.Merge(outputs, sizes, p.batch_dim)

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, *input_shapes: Any) -> NestedMap:
        return sequential.ChainMeta(p, p.cell_tpl, input_shapes)
