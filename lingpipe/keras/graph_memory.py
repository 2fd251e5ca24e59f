"""Memory per device of a Keras graph cut into stages, in a training step: an estimate.

The same model as lingpipe.pipeline.observe.memory's for PipeliningLayer cells, with a Keras
graph's layer calls (nodes) as the units:

- weights, gradients, optimizer slots: each layer's, on the stage where it is first
  called (where its variables live); an embedding's gradient is its slices, as the
  executor sums them for Keras' optimizers (gradient_sums): each micro-batch's
  concatenated, the whole batch's rows by the step's end, or one micro-batch's where
  every micro-batch looks up the same rows (positions);
- activations: per stage, the tensors it receives (those alive across the cut, as
  graph.LiveTensors finds them) and, for each micro-batch whose forward is kept, what
  its nodes' backwards read; alive per the schedule (memory.ActivationEvents over the
  simulated schedule, remat.Kept for the policy); a device sums its stages'
  (memory.DeviceMemory);
- workspace: a backward's transients for one micro-batch, as memory.StageWorkspaces
  counts them: each node's own (op_walk.Transients over its traced gradient ops, what
  it frees of its activations too), on top of what the nodes whose backward ran before
  it left, at least the gradients passed across the stage, and the largest weight
  gradient;
- update: at the step's end, what the optimizer's update of the stage's largest
  variable holds (update_memory): Keras' Adam makes an embedding's slices dense there,
  twice.

What a node's backward reads is found, not guessed: `TraceNodes` traces each node's
forward and its tf.gradients in a tf.function that never runs (nothing is allocated)
and sums the forward tensors the gradient ops read, views resolved, weights left out:
its arguments, its outputs, and its intermediates. Traced once, for one example;
a micro-batch of b rows holds b times as much (unknown dims count as 1).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from lingpipe.keras import graph as graph_lib
from lingpipe.pipeline.observe import memory, op_walk, update_memory
from lingpipe.pipeline.schedules import simulate
from lingpipe.pipeline.schedules.schedule import Schedule
from lingpipe.pipeline.step import executor, gradient_sums
from lingpipe.pipeline.step import remat as remat_lib

__all__ = [
    "GraphMemory",
    "NodeMemory",
    "SlotsPerWeight",
    "TraceNodes",
    "WeightBytes",
    "WeightCounts",
]

# Readers that need only a shape.
_SHAPE_READERS = frozenset({"Shape", "ShapeN", "Size", "Rank"})


@dataclasses.dataclass(frozen=True)
class NodeMemory:
    """What one node's backward reads, per example (bytes), and its layer's weights.

    Attributes:
      saved_args: keys of its arguments that its backward reads.
      saved_outputs: keys of its outputs that its backward reads.
      internal_bytes: the other forward tensors its backward reads (not its arguments,
        outputs or weights), per example.
      weight_bytes: every variable of its layer where the layer is first called, else 0.
      trainable_bytes: the trainable ones, likewise.
      weight_args, weight_outputs, weight_internal_bytes: what of the above its
        weight-only gradient ops read (held from a split backward's I to its W).
      deferred_bytes: the gradients its weight-only gradient ops read from the rest of
        its backward, per example (memory.CellMemory.deferred_bytes).
      backward_transient_bytes, backward_end_bytes: the most its backward holds at once
        beyond its saved activations, weight-only ops left out, and what it leaves at
        its end, per example (memory.CellMemory's).
      input_transient_bytes, input_end_bytes: a split backward's I's, likewise
        (memory.CellMemory's).
      weight_gradients: its layer's trainable variables and their gradients, where the
        layer is first called (WeightGradient), else ().
    """

    saved_args: tuple
    saved_outputs: tuple
    internal_bytes: int
    weight_bytes: int
    trainable_bytes: int
    weight_args: tuple = ()
    weight_outputs: tuple = ()
    weight_internal_bytes: int = 0
    deferred_bytes: int = 0
    backward_transient_bytes: int = 0
    backward_end_bytes: int = 0
    input_transient_bytes: int = 0
    input_end_bytes: int = 0
    weight_gradients: tuple = ()

    def GradientBytes(self, rows: int) -> int:
        """The gradients of its weights from `rows` examples: dense, or slices."""
        return sum(w.Bytes(rows) for w in self.weight_gradients)


@dataclasses.dataclass(frozen=True)
class WeightGradient:
    """A trainable variable and its gradient as the executor sums it for Keras'
    optimizers: dense, or (`sliced`, an embedding's table) its slices, values in
    float32 and indices: `slice_bytes` per example where the rows looked up depend on
    the node's arguments (concatenated over micro-batches), `shared_slice_bytes` where
    they do not (positions 0..T-1: one micro-batch's, added in place over the others).
    """

    variable_bytes: int
    sliced: bool = False
    slice_bytes: int = 0
    shared_slice_bytes: int = 0

    def Bytes(self, rows: int) -> int:
        """Its gradient from `rows` examples."""
        if not self.sliced:
            return self.variable_bytes
        return rows * self.slice_bytes + self.shared_slice_bytes

    def Update(self, cost: update_memory.UpdateCost, rows: int) -> int:
        """What the optimizer's update of it holds (`cost`), its gradient from `rows`."""
        return cost.Bytes(self.variable_bytes, self.Bytes(rows) if self.sliced else None)


def _VariableBytes(variables: Sequence[Any]) -> int:
    return sum(math.prod(v.shape) * tf.as_dtype(v.dtype).size for v in variables)


def _Slices(weight_grads: list, args: list) -> dict[int, tuple[int, int]]:
    """Of a traced node's weight gradients, those that are slices (tf.IndexedSlices: an
    embedding's): by position, (their bytes where the rows looked up depend on `args`,
    their bytes where not), values counted in float32 as the sums hold them."""
    out = {}
    for i, g in enumerate(weight_grads):
        if not isinstance(g, tf.IndexedSlices):
            continue
        # One slice per index looked up; the gradient's own shapes are dynamic.
        indices = op_walk.Source(g.indices)
        count = indices.shape.num_elements() if indices.shape.is_fully_defined() else 1
        row = math.prod(d or 1 for d in g.values.shape[1:])
        size = count * (row * max(g.values.dtype.size, 4) + indices.dtype.size)
        out[i] = (size, 0) if gradient_sums.DependsOn(g.indices, args) else (0, size)
    return out


def _Saved(node: graph_lib.GraphNode, specs: list) -> tuple:
    """What the node's gradient ops read, traced for `specs` without running: (all of
    them, the weight-only ones), each as (argument positions, output positions, other
    bytes); the bytes of the gradients that the weight-only ops read from the rest
    (held from a split backward's I to its W, as memory.CellMemory.deferred_bytes); the
    backward's transients (memory.BackwardTransients); and its weights' slices
    (_Slices)."""
    call, variables = graph_lib.NodeCall(node), graph_lib.TrainableVariables(node)
    found: dict = {}

    def Fn(*args: Any) -> Any:
        g = tf.compat.v1.get_default_graph()
        outputs = call(*args)
        forward = set(g.get_operations())
        ys = [y for y in outputs if y.dtype.is_floating]
        xs = [x for x in args if x.dtype.is_floating]
        grads, dys = [], []
        if ys and xs + list(variables):
            dys = [tf.ones(y.shape, y.dtype) for y in ys]
            grads = tf.gradients(ys, xs + list(variables), grad_ys=dys)
        backward = [op for op in g.get_operations() if op not in forward]
        weight_only = executor.WeightOnlyOps(backward, grads[: len(xs)], grads[len(xs) :])
        deferred = memory.DeferredBytes(backward, weight_only)
        found.update(forward=forward, args=args, outputs=outputs, backward=backward)
        found.update(weight_only=weight_only, deferred=deferred)
        found["slices"] = _Slices(grads[len(xs) :], list(args))
        # What it reads of its own forward: its arguments are other nodes' outputs (or the
        # stage's inputs), whose backwards may read them after it, so it frees none.
        arg_refs = {x.ref() for x in args}
        sources = [op_walk.Source(t) for op in backward for t in op.inputs]
        held = {
            t.ref(): t for t in sources
            if t.op in forward and t.op.type not in op_walk.NOT_ACTIVATIONS
            and t.ref() not in arg_refs
        }  # fmt: skip
        found["transients"] = memory.BackwardTransients(
            backward, weight_only, list(held.values()), dys, grads[: len(xs)]
        )
        return 0

    # Traced, never run; Keras layers need no autograph (and it costs most of a trace).
    tf.function(Fn, autograph=False).get_concrete_function(*specs)
    arg_at = {x.ref(): i for i, x in enumerate(found["args"])}
    out_at = {op_walk.Source(y).ref(): i for i, y in enumerate(found["outputs"])}

    def Read(ops: Any) -> tuple:
        args, outs, other = set(), set(), {}
        for op in ops:
            if op.type in _SHAPE_READERS:
                continue
            for t in map(op_walk.Source, op.inputs):
                if t.op not in found["forward"] or t.op.type in op_walk.NOT_ACTIVATIONS:
                    continue
                if t.ref() in arg_at:
                    args.add(arg_at[t.ref()])
                elif t.ref() in out_at:
                    outs.add(out_at[t.ref()])
                else:
                    other[t.ref()] = op_walk.Bytes(t)
        return tuple(sorted(args)), tuple(sorted(outs)), sum(other.values())

    saved = Read(found["backward"]), Read(found["weight_only"])
    return saved + (found["deferred"], found["transients"], found["slices"])


def _FloatArgs(graph: graph_lib.Graph, i: int) -> int:
    """Bytes per example of node i's floating-point arguments: what its inputs' gradient
    holds."""
    return sum(
        graph_lib.TensorBytes(graph, x) for x in graph.nodes[i].arg_keys
        if tf.as_dtype(graph.dtypes[x]).is_floating
    )  # fmt: skip


def _FirstCallWeights(graph: graph_lib.Graph, trainable: bool) -> list[list]:
    """Per node, its layer's variables (or trainable ones) where the layer is first
    called, none at its later calls and for keras.ops operations."""
    seen: set = set()
    out = []
    for node in graph.nodes:
        if not node.is_layer or id(node.operation) in seen:
            out.append([])  # a later call, or a keras.ops operation (no weights to read)
            continue
        seen.add(id(node.operation))
        layer = node.operation
        out.append(list(layer.trainable_weights if trainable else layer.weights))
    return out


def WeightBytes(graph: graph_lib.Graph, trainable: bool = False) -> list[int]:
    """Per node, the bytes of its layer's variables (or trainable ones) where the layer is
    first called, 0 at its later calls and for keras.ops operations."""
    return [_VariableBytes(w) for w in _FirstCallWeights(graph, trainable)]


def WeightCounts(graph: graph_lib.Graph) -> list[int]:
    """Per node, the number of its layer's trainable variables, counted as WeightBytes
    counts their bytes (what the optimizer applies one by one)."""
    return [len(w) for w in _FirstCallWeights(graph, trainable=True)]


def TraceNodes(graph: graph_lib.Graph, where: str = "lingpipe.keras.Plan") -> list[NodeMemory]:
    """Each node's NodeMemory (module doc); a node that cannot be traced is one line."""
    weights, trainable = WeightBytes(graph), WeightBytes(graph, trainable=True)
    traced: dict = {}  # graph.CallKey -> _Saved: a model's repeated blocks are traced once
    out = []
    for i, node in enumerate(graph.nodes):
        specs = graph_lib.ExampleSpecs(graph, node)
        key = graph_lib.CallKey(node, specs)
        try:
            saved = traced[key] if key in traced else _Saved(node, specs)
        except Exception as e:  # noqa: BLE001 (any failure of a user's layer, named)
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise ValueError(
                f"{where}: cannot trace layer call {node.name!r} to estimate its memory: "
                f"{type(e).__name__}: {first}"
            ) from None
        if key is not None:
            traced[key] = saved
        (args, outs, internal), (w_args, w_outs, w_internal), deferred, transients = saved[:4]
        slices = saved[4]
        variables = graph_lib.TrainableVariables(node) if trainable[i] else []
        weight_gradients = tuple(
            WeightGradient(_VariableBytes([v]), j in slices, *slices.get(j, (0, 0)))
            for j, v in enumerate(variables)
        )
        out.append(
            NodeMemory(
                saved_args=tuple(k for j, k in enumerate(node.arg_keys) if j in args),
                saved_outputs=tuple(k for j, k in enumerate(node.out_keys) if j in outs),
                internal_bytes=internal,
                weight_bytes=weights[i],
                trainable_bytes=trainable[i],
                weight_args=tuple(k for j, k in enumerate(node.arg_keys) if j in w_args),
                weight_outputs=tuple(k for j, k in enumerate(node.out_keys) if j in w_outs),
                weight_internal_bytes=w_internal,
                deferred_bytes=deferred,
                backward_transient_bytes=transients[0],
                backward_end_bytes=transients[1],
                input_transient_bytes=transients[2],
                input_end_bytes=transients[3],
                weight_gradients=weight_gradients,
            )
        )
    return out


def SlotsPerWeight(optimizer: Any, where: str = "lingpipe.keras.Plan") -> float:
    """Weight-sized slots a Keras optimizer keeps per weight (SGD 0, SGD with momentum 1,
    Adam 2, ...): a copy of it built on one 8 x 8 probe variable, its new variables
    counted. A number is taken as it is."""
    if isinstance(optimizer, (int, float)) and not isinstance(optimizer, bool):
        return float(optimizer)
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(
            f"{where}: expected optimizer to be a Keras optimizer or a number of slots per "
            f"weight, received {type(optimizer).__name__} {optimizer!r:.60}"
        )
    try:
        probe = type(optimizer).from_config(optimizer.get_config())
        before = {id(v) for v in probe.variables}
        probe.build([keras.Variable(np.zeros((8, 8), "float32"), name="probe")])
    except Exception as e:  # noqa: BLE001 (whatever an optimizer's own build raises)
        raise ValueError(
            f"{where}: cannot count the slots of optimizer {type(optimizer).__name__} "
            f"({type(e).__name__}); pass optimizer= a number of slots per weight (Adam: 2)"
        ) from None
    added = [v for v in probe.variables if id(v) not in before]
    return sum(math.prod(v.shape) for v in added) / 64.0


@dataclasses.dataclass
class GraphMemory:
    """A traced graph's memory facts, from which each candidate's memory follows."""

    graph: graph_lib.Graph
    nodes: list[NodeMemory]
    slots_per_weight: float
    # The optimizer's update per byte (update_memory.UpdateCostOf); zero: not counted.
    update_cost: update_memory.UpdateCost = update_memory.UpdateCost()

    def Stages(
        self,
        stage_nodes: Sequence[Sequence[int]],
        sched: Schedule,
        remat: remat_lib.Remat,
        batch_size: int,
    ) -> list[memory.StageMemory]:
        """Per stage of `sched` (node indices in `stage_nodes`), its memory in a step
        over `batch_size` rows split into sched.num_micro_batches micro-batches."""
        graph, m = self.graph, sched.num_micro_batches
        rows = -(-batch_size // m)  # the largest micro-batch
        stages = [list(idx) for idx in stage_nodes]
        live = graph_lib.LiveTensors(graph, stages)
        sim, kept = simulate.Simulate(sched), remat_lib.Kept(sched, remat)
        batch_bytes = batch_size * sum(graph_lib.TensorBytes(graph, k) for k in live[0])
        out = []
        for k, idx in enumerate(stages):
            received = sum(graph_lib.TensorBytes(graph, x) for x in live[k]) * rows
            sent = sum(graph_lib.TensorBytes(graph, x) for x in live[k + 1]) * rows
            mine = [self.nodes[i] for i in idx]
            read = {x for n in mine for x in n.saved_args + n.saved_outputs} - set(live[k])
            internal = rows * (
                sum(n.internal_bytes for n in mine)
                + sum(graph_lib.TensorBytes(graph, x) for x in read)
            )
            boundary = received if k else 0  # stage 0's inputs: the batch, counted once
            # What W reads of them: a split backward holds it from I's end to W's.
            for_w = {x for n in mine for x in n.weight_args + n.weight_outputs}
            held = rows * (
                sum(n.weight_internal_bytes for n in mine)
                + sum(graph_lib.TensorBytes(graph, x) for x in for_w - set(live[k]))
            )
            if k:
                held += rows * sum(graph_lib.TensorBytes(graph, x) for x in for_w & set(live[k]))
            deferred = rows * sum(n.deferred_bytes for n in mine)
            events = memory.ActivationEvents(
                sim, m, k, kept, boundary, internal, deferred, min(held, boundary + internal)
            )
            trainable = sum(n.trainable_bytes for n in mine)
            gradients = sum(n.GradientBytes(batch_size) for n in mine)
            weights = [w for n in mine for w in n.weight_gradients]
            update = max((w.Update(self.update_cost, batch_size) for w in weights), default=0)
            units = [
                memory.Unit(
                    transient=rows * n.backward_transient_bytes,
                    leaves=rows * (n.backward_end_bytes - sent_on),
                    input_transient=rows * n.input_transient_bytes,
                    input_leaves=rows * (n.input_end_bytes - sent_on),
                    gradients=n.GradientBytes(rows),
                )
                for n, sent_on in zip(mine, (_FloatArgs(graph, i) for i in idx))
            ]
            spaces = memory.StageWorkspaces(units, received, sent)
            out.append(
                memory.StageMemory(
                    weights=sum(n.weight_bytes for n in mine),
                    gradients=gradients,
                    optimizer_slots=int(self.slots_per_weight * trainable),
                    activations=simulate.PeakOf(events) + (batch_bytes if k == 0 else 0),
                    workspace=spaces.most if sched.has_backward else 0,
                    peak_alive=sim.peak_alive[k],
                    events=tuple(events),
                    alive_events=tuple(memory.ActivationEvents(sim, m, k, set(), 1, 0, ramp=False)),
                    step_events=tuple(
                        memory.StepEvents(sim, k, gradients, spaces, update, sched.stage_devices)
                    ),
                    update=update if sched.has_backward else 0,
                )
            )
        return out

    def PerDevice(
        self,
        stage_nodes: Sequence[Sequence[int]],
        sched: Schedule,
        remat: remat_lib.Remat,
        batch_size: int,
    ) -> list[memory.StageMemory]:
        """Per device of `sched`: the memory of all the stages it runs (DeviceMemory)."""
        stages = self.Stages(stage_nodes, sched, remat, batch_size)
        per_device: list[list] = [[] for _ in range(sched.num_devices)]
        for s, stage in enumerate(stages):
            per_device[sched.stage_devices[s]].append(stage)
        return [memory.DeviceMemory(ms) for ms in per_device]
