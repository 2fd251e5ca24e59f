"""Memory of each pipeline stage in a training step: an estimate, in bytes.

Per stage:

- weights: every variable of the stage's cells (batch norm's moving statistics too).
- gradients: the running sum over micro-batches of each trainable weight's gradient.
- optimizer slots: what the optimizer keeps per trainable weight (`SlotBytes`).
- update: what the optimizer's update of the stage's largest variable makes, at the
  step's end (update_memory.UpdateCostOf: Adam two weight-sized tensors, SGD one); the
  activations and workspaces are freed by then.
- received: with R > 1 replicas, replica 0's stages (Estimate's `replicas`) average
  each gradient where their copy lives (train_loop.ReduceOnGradientDevices). The
  replicas run in lockstep, so each other replica's copy of a gradient arrives as the
  stage's own last backward completes it: from the start of that backward to the
  step's end they hold (R - 1) x the gradients received and one mean being made (of
  the largest weight). The copies come while that backward's activations and
  workspace are still alive.
- activations: what the step keeps alive for the backward under the schedule and the
  remat policy: the peak over the schedule's simulated time of what the micro-batches
  hold (`ActivationEvents`).
- workspace: what one micro-batch's backward makes and frees within its action, beyond
  the activations: the gradients passed from op to op and the largest weight gradient
  before it joins the sum. Each cell's backward is walked op by op in order, each
  tensor alive from its op to its last reader, an element-wise op writing into an
  input it reads last (op_walk.Transients): what it holds at most, and what it leaves at its
  end (its activations freed, below 0). A backward runs its stage's cells last first,
  each cell's peak on top of what the cells before it left (`StageWorkspaces`): a
  stage's backward frees its activations cell by cell. In the stage's first backward
  each cell's weight gradients stay, as the running sum; the gradients are counted
  whole from its end. A split backward's I holds what W will read from the moment it
  makes it; W, the weights' gradients.
- deferred weight gradients (split-backward schedules: zero_bubble, zbv, v_half, v_min,
  ...): from a micro-batch's I to its W, the gradients that the weight-gradient ops will
  read (a matmul's output gradient dz for x^T dz), computed by I and held for W
  (`CellMemory.deferred_bytes`), from I's end. They peak together with the activations.
  What I alone reads of the activations (a softmax's probabilities, a ReLU's output) is
  freed when I ends; what W reads (a matmul's input x) is held until W reads it
  (`WeightHeld`): W frees it as its ops run. Which ops W runs is the executor's own rule
  (lingpipe.pipeline.step.executor.WeightOnlyOps).

A cell's activations are measured, not guessed: `TraceCells` builds each cell in a
throw-away graph (no memory is allocated, so a model too big for the machine can be
estimated), takes `tf.gradients` of its outputs, and sums the bytes of the forward
tensors that the gradient ops read: exactly what a tape keeps. Views (Reshape,
Identity, ...) count as the tensor they view; the weights and the cell's inputs are
not activations. Temporaries inside one op are not counted.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from lingpipe import base_layer, hyperparams, optimizers
from lingpipe.pipeline.observe import op_walk, update_memory
from lingpipe.pipeline.planning import costs
from lingpipe.pipeline.schedules import simulate
from lingpipe.pipeline.schedules.schedule import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    Action,
    Schedule,
)
from lingpipe.pipeline.step import executor, micro_batch
from lingpipe.pipeline.step import remat as remat_lib

__all__ = [
    "ActivationEvents",
    "BackwardTransients",
    "CellMemory",
    "DeferredBytes",
    "DeviceMemory",
    "Estimate",
    "HostMemory",
    "StepEvents",
    "MeasuredPeaks",
    "MicroBatchSpecs",
    "Note",
    "ResetPeaks",
    "SlotBytes",
    "StageActivations",
    "StageMemory",
    "TraceCells",
    "TracedFor",
    "WeightHeld",
    "StageWorkspaces",
    "Unit",
    "Units",
    "WalkPeak",
    "Workspaces",
]


@dataclasses.dataclass(frozen=True)
class CellMemory:
    """What one cell costs, for one micro-batch of given input shapes (bytes).

    Attributes:
      weight_bytes: all variables of the cell.
      trainable_shapes: shapes (lists of ints) of its trainable variables.
      dtype_size: bytes per element of the trainable variables.
      input_bytes: the cell's inputs.
      saved_bytes: forward tensors (not inputs, not weights) its backward reads.
      input_saved_bytes: the part of the inputs its backward reads.
      output_saved_bytes: the part of `saved_bytes` that is the cell's outputs.
      output_bytes: the cell's outputs.
      deferred_bytes: gradient tensors that the weight-only gradient ops read and the
        input-gradient ops make (or receive): what a split backward holds from I to W.
      weight_saved_bytes: the part of `saved_bytes` that the weight-only gradient ops
        read: what a split backward's I leaves alive for W. None: not traced (all of it).
      weight_input_saved_bytes: the part of `input_saved_bytes` they read (None: all).
      backward_transient_bytes, backward_end_bytes: the most its backward holds at once
        beyond its saved activations (the outputs' gradients received, its inputs'
        gradients, what passes between), leaving out the weight-only gradient ops'
        tensors (the workspace adds the largest weight gradient), and what it leaves
        beyond them at its end, its inputs' gradients included (below 0 where it frees
        more than it makes): BackwardTransients.
      input_transient_bytes, input_end_bytes: the most a split backward's I holds at
        once beyond the saved activations, and what it leaves beyond them at its end
        (below 0 where it frees more than it makes): BackwardTransients.
      out_specs: the outputs as tf.TensorSpecs, the next cell's inputs.
    """

    weight_bytes: int
    trainable_shapes: tuple
    dtype_size: int
    input_bytes: int
    saved_bytes: int
    input_saved_bytes: int
    output_saved_bytes: int
    output_bytes: int
    out_specs: Any
    deferred_bytes: int = 0
    weight_saved_bytes: int | None = None
    weight_input_saved_bytes: int | None = None
    backward_transient_bytes: int = 0
    backward_end_bytes: int = 0
    input_transient_bytes: int = 0
    input_end_bytes: int = 0


@dataclasses.dataclass
class StageMemory:
    """A stage's estimated memory in a training step, bytes (see the module doc)."""

    weights: int
    gradients: int
    optimizer_slots: int
    activations: int
    workspace: int  # a backward's transients beside the gradients (Workspaces.most)
    peak_alive: int  # most micro-batches alive at once (simulate.Simulation.peak_alive)
    # The optimizer's update of the largest variable, at the step's end (update_memory).
    update: int = 0
    # On replica 0 of R > 1: the other replicas' gradients received (module doc).
    received: int = 0
    # (time, delta) of the activation bytes and of the alive micro-batches, for DeviceMemory.
    events: tuple = dataclasses.field(default=(), repr=False, compare=False)
    alive_events: tuple = dataclasses.field(default=(), repr=False, compare=False)
    # (time, delta) of the gradients and of the workspace, for HostMemory (StepEvents).
    step_events: tuple = dataclasses.field(default=(), repr=False, compare=False)
    # The parts' joint peak over the step where it is known (DeviceMemory): at most
    # their sum, which peak at different times.
    joint: int | None = None

    @property
    def total(self) -> int:
        if self.joint is not None:
            return self.joint
        held = self.weights + self.gradients + self.optimizer_slots
        return held + max(self.activations + self.workspace + self.received, self.update)


def _Placeholder(spec: Any) -> tf.Tensor:
    return tf.compat.v1.placeholder(spec.dtype, spec.shape)


def _TraceInGraph(p: Any, in_specs: tuple) -> CellMemory:
    graph = tf.Graph()
    with graph.as_default():
        cell = p.Set(name=p.name or "cell").Instantiate()
        inputs = tf.nest.map_structure(_Placeholder, in_specs)
        outputs = cell.FProp(cell.theta, *inputs)
        flat_in = [x for x in tf.nest.flatten(inputs) if x.dtype.is_floating]
        flat_out = [y for y in tf.nest.flatten(outputs) if y.dtype.is_floating]
        trainable = list(cell.trainable_variables)
        forward = set(graph.get_operations())
        grads, dys = [], []
        if flat_out:
            dys = [_Placeholder(y) for y in flat_out]
            grads = tf.gradients(flat_out, flat_in + trainable, grad_ys=dys)
        backward = [op for op in graph.get_operations() if op not in forward]
        n = len(flat_in)
        weight_only = executor.WeightOnlyOps(backward, grads[:n], grads[n:])
        deferred = DeferredBytes(backward, weight_only)
        saved = _Read(backward, forward)  # {tensor: bytes}: the forward tensors the backward reads
        for_weights = _Read(weight_only, forward)
        inputs_ref = {x.ref() for x in tf.nest.flatten(inputs)}
        outputs_ref = {op_walk.Source(y).ref() for y in tf.nest.flatten(outputs)}
        kept_back = [r.deref() for r in saved if r not in inputs_ref]
        transients = BackwardTransients(backward, weight_only, kept_back, dys, grads[:n])
    return CellMemory(
        weight_bytes=sum(op_walk.Bytes(v) for v in cell.variables),
        trainable_shapes=tuple(tuple(v.shape.as_list()) for v in trainable),
        dtype_size=trainable[0].dtype.size if trainable else 4,
        input_bytes=sum(op_walk.Bytes(x) for x in tf.nest.flatten(inputs)),
        saved_bytes=sum(b for r, b in saved.items() if r not in inputs_ref),
        input_saved_bytes=sum(b for r, b in saved.items() if r in inputs_ref),
        output_saved_bytes=sum(b for r, b in saved.items() if r in outputs_ref),
        output_bytes=sum(op_walk.Bytes(y) for y in tf.nest.flatten(outputs)),
        out_specs=tf.nest.map_structure(
            lambda y: tf.TensorSpec(y.shape, y.dtype), costs.AsArgs(outputs)
        ),
        deferred_bytes=deferred,
        weight_saved_bytes=sum(b for r, b in for_weights.items() if r not in inputs_ref),
        weight_input_saved_bytes=sum(b for r, b in for_weights.items() if r in inputs_ref),
        backward_transient_bytes=transients[0],
        backward_end_bytes=transients[1],
        input_transient_bytes=transients[2],
        input_end_bytes=transients[3],
    )


def _Read(ops: Any, forward: set) -> dict:
    """{tensor ref: bytes} of the forward tensors (views resolved; not weights or
    constants) that `ops` read."""
    read = {}
    for op in ops:
        for t in op.inputs:
            src = op_walk.Source(t)
            if src.op in forward and src.op.type not in op_walk.NOT_ACTIVATIONS:
                read[src.ref()] = op_walk.Bytes(src)
    return read


def BackwardTransients(
    backward: Sequence[Any],
    weight_only: set,
    saved: Sequence[Any],
    dys: Sequence[Any],
    input_grads: Sequence[Any],
) -> tuple[int, int, int, int]:
    """(B's transient, what B leaves beyond `saved`, I's transient, what I leaves) of
    one cell's traced backward (Transients), from the gradients of its outputs `dys` to
    those of its inputs: B runs the ops in graph order, the weight-only ops' tensors
    left out (the workspace adds the largest weight gradient); I runs the rest, and
    holds what the weight-only ops will read (the gradients it makes for W, the saved
    tensors W reads) to its end, however early it made them."""
    dxs = {op_walk.Source(g).ref() for g in input_grads if g is not None}
    b, b_end = op_walk.Transients(backward, dxs, weight_only, held=saved, received=dys)
    for_w = {op_walk.Source(t).ref() for op in weight_only for t in op.inputs}
    i_ops = [op for op in backward if op not in weight_only]
    i, i_end = op_walk.Transients(i_ops, dxs | for_w, held=saved, received=dys)
    return b, b_end, i, i_end


def DeferredBytes(backward: list, weight_only: set) -> int:
    """Bytes of the gradient tensors (not forward tensors) that the `weight_only` ops
    of `backward` read from the rest: what the executor's I leaves for its W."""
    within = set(backward)
    held = {}
    for op in weight_only:
        for t in op.inputs:
            src = op_walk.Source(t)
            if src.op in within and src.op not in weight_only:  # the dy fed in is in `within`
                held[src.ref()] = op_walk.Bytes(src)
    return sum(held.values())


_TRACES: dict[tuple[str, str], CellMemory] = {}


def TraceCells(
    parent_p: hyperparams.Params, cell_params: Sequence[Any], in_specs: tuple
) -> list[CellMemory]:
    """The memory of each cell in turn, each fed the previous one's outputs, from the
    first one's inputs `in_specs` (a tuple of tf.TensorSpecs or NestedMaps of them, one
    micro-batch). Identical cells on identical inputs are traced once."""
    out = []
    for cell_p in cell_params:
        try:
            # The cell as the parent builds it: what it inherits is in its own params.
            p = base_layer.BaseLayer.CopyBaseParams(parent_p, cell_p.Copy())
            shapes = tf.nest.map_structure(lambda s: (s.shape.as_list(), s.dtype.name), in_specs)
            key = (p.ToText(), repr(shapes))
            if key not in _TRACES:
                _TRACES[key] = _TraceInGraph(p, in_specs)
        except Exception as e:  # noqa: BLE001 (any failure of a user's layer, with its name)
            raise ValueError(
                f"memory estimate: cannot trace {cell_p.cls.__name__} ({cell_p.name}) on inputs "
                f"{in_specs}: {type(e).__name__}: {e}"
            ) from None
        out.append(_TRACES[key])
        in_specs = _TRACES[key].out_specs
    return out


def SlotBytes(optimizer: Any, shapes: Sequence[Sequence[int]], dtype_size: int = 4) -> int:
    """Bytes of the optimizer's slots for trainable weights of `shapes`, `dtype_size` bytes
    per element. `optimizer`: None (no optimizer: 0), a number of weight-sized slots per
    weight, or the params (or instance) of a lingpipe.optimizers class, which counts its
    slots (`SlotElements`: Adam 2 copies, Momentum 1, SGD 0, ...)."""
    if optimizer is None:
        return 0
    if isinstance(optimizer, (int, float)) and not isinstance(optimizer, bool):
        return int(optimizer * sum(map(math.prod, shapes)) * dtype_size)
    cls = getattr(optimizer, "cls", None) or type(optimizer)
    ours = isinstance(cls, type) and issubclass(cls, optimizers.BaseOptimizer)
    elements = cls.SlotElements(shapes) if ours else None
    if elements is None:
        raise ValueError(
            f"memory estimate: expected optimizer to be None, a number of slots per weight, or "
            f"the params of SGD, Momentum, Adam, Adafactor or another lingpipe.optimizers "
            f"class that counts its slots (SlotElements); received {optimizer!r}"
        )
    return elements * dtype_size


def StageActivations(cells: Sequence[CellMemory]) -> tuple[int, int]:
    """(boundary, internal) bytes of one micro-batch through these consecutive cells.

    boundary: the stage's inputs. internal: what a kept forward holds beyond them,
    each tensor once (a cell's output that the next cell's backward also reads).
    """
    internal = sum(c.saved_bytes for c in cells)
    for prev, c in zip(cells, cells[1:]):
        internal += max(0, c.input_saved_bytes - prev.output_saved_bytes)
    return cells[0].input_bytes, internal


def WeightHeld(cells: Sequence[CellMemory], boundary: int, internal: int) -> int:
    """Bytes of a stage's activations for one micro-batch (StageActivations' `boundary`
    and `internal`) that its weight-only gradient ops read: what a split backward holds
    from the end of I to the end of W. A cell's inputs within the stage are the previous
    cell's outputs (internal); the first cell's are the stage's (boundary). Untraced
    cells (None) count as read whole."""
    if any(c.weight_saved_bytes is None or c.weight_input_saved_bytes is None for c in cells):
        return boundary + internal
    inner = sum(c.weight_saved_bytes for c in cells)
    inner += sum(c.weight_input_saved_bytes for c in cells[1:])
    return min(boundary, cells[0].weight_input_saved_bytes) + min(internal, inner)


@dataclasses.dataclass(frozen=True)
class Unit:
    """One cell's (one Keras layer call's) backward for one micro-batch, as a stage's
    workspace needs it (bytes; Transients' figures): B's most at once and what it
    leaves at its end, the inputs' gradient it passes on left out (below 0: it frees
    its activations); the same of a split backward's I (what it leaves for W
    included); its weights' gradients."""

    transient: int
    leaves: int
    input_transient: int
    input_leaves: int
    gradients: int


@dataclasses.dataclass(frozen=True)
class Workspaces:
    """What a stage's backward actions hold besides the activations, for one micro-batch
    (StageWorkspaces): a B beside the running sum of the gradients; the stage's first B,
    whose weights' gradients become that sum; a split backward's I; its W."""

    backward: int
    first: int
    input: int
    weight: int
    # A B and the first B while no other device runs (StageWorkspaces): None, as loaded.
    backward_alone: int | None = None
    first_alone: int | None = None

    @property
    def most(self) -> int:
        """The most of them that the gradients do not already count."""
        return max(self.backward, self.input, self.weight)


def Units(cells: Sequence[CellMemory]) -> list[Unit]:
    """Each cell's Unit, from its CellMemory."""
    return [
        Unit(
            transient=c.backward_transient_bytes,
            leaves=c.backward_end_bytes - c.input_bytes,
            input_transient=c.input_transient_bytes,
            input_leaves=c.input_end_bytes - c.input_bytes,
            gradients=sum(map(math.prod, c.trainable_shapes)) * c.dtype_size,
        )
        for c in cells
    ]


def StageWorkspaces(units: Sequence[Unit], received: int, sent: int) -> Workspaces:
    """A stage's Workspaces from its units in order (the backward runs them last first),
    the gradients it receives and sends on.

    A B runs a unit's weight-gradient ops when the runtime gets to them, which under
    load (two devices' actions sharing the host's threads) is as late as a split
    backward's W: each unit holds the larger of its B's and its I's peaks (its I holds
    what those ops read until its end). A B that runs alone (backward_alone, first_alone:
    no other device's action beside it) runs them as they come ready, its walk in graph
    order: on the Keras classifier at M=1 (its Bs alone) a transformer block's B held
    12 MiB above its activations, the graph-order walk 6, its I's walk 24. A unit
    leaves what its B leaves: the order of the ops changes its peak, not its end. A B
    holds at least the larger of the gradients received and sent; a split I, both (it
    keeps what it received for W). A B's largest weight gradient is made before it
    joins the running sum; in the first B, each unit's stays."""
    order = units[::-1]
    largest = max(u.gradients for u in units)
    least = max(received, sent)

    def Backs(peaks: list[int]) -> tuple[int, int]:
        backward = WalkPeak([(p, u.leaves) for p, u in zip(peaks, order)], least) + largest
        first = WalkPeak(
            [(p + u.gradients, u.leaves + u.gradients) for p, u in zip(peaks, order)], least
        )
        return backward, first

    backward, first = Backs([max(u.transient, u.input_transient) for u in order])
    backward_alone, first_alone = Backs([u.transient for u in order])
    split = WalkPeak([(u.input_transient, u.input_leaves) for u in order], received + sent)
    return Workspaces(backward, first, split, largest, backward_alone, first_alone)


def WalkPeak(parts: Sequence[tuple[int, int]], least: int = 0) -> int:
    """The most a backward holds at once over units (cells, Keras layer calls) given in
    the order it runs them, each as (the most its own backward holds at once, what it
    leaves for the units after it): a unit's peak on top of what the units before it
    left; at least `least`."""
    left, most = 0, least
    for transient, leaves in parts:
        most = max(most, left + transient)
        left += leaves
    return most


# W frees what it reads as its ops run: in this many equal shares through its time.
RAMP_STEPS = 4


def ActivationEvents(
    sim: Any,
    num_micro_batches: int,
    stage: int,
    kept: set,
    boundary: int,
    internal: int,
    deferred: int = 0,
    weight_held: int | None = None,
    ramp: bool = True,
) -> list[tuple[float, int]]:
    """(time, +bytes or -bytes) of the activations stage `stage` holds in the simulated
    time of `sim` (the schedule's simulate.Simulation).

    A micro-batch is alive from the start of its forward to the end of its backward
    (the forward's own end in a forward-only schedule) and holds `boundary`, plus
    `internal` (StageActivations of one micro-batch) when it is in `kept`, the (stage,
    micro-batch) pairs whose forward keeps its activations. The backward of one that is
    not kept replays its forward first and holds `internal` from the replay's end to the
    backward's end: the replay builds them up as it runs, and takes the share F / (F +
    the backward) of the backward's simulated time.

    Where the backward is split into I and W, I turns what it alone reads of the
    activations into the gradients that W reads: from I's end, `weight_held` bytes of
    the activations (WeightHeld: what W reads; None: all of them) and `deferred` bytes
    (the stage's CellMemory.deferred_bytes) are alive, and W frees them as its ops read
    them: a share at each of RAMP_STEPS points through W, the last at its end (with
    `ramp`; all at W's end without). Within I, as within a B, one cell's backward's
    transients are not counted: a softmax's probabilities, read by I alone, give way to
    the logits' gradient, read by W.
    """
    events = []
    for m in range(num_micro_batches):
        last = simulate.LastAction(stage, m, sim.end)
        held = boundary + (internal if (stage, m) in kept else 0)
        split = Action(BACKWARD_INPUT, stage, m)
        is_split = split in sim.start and last != split
        # The activations are held to the end of the backward, or of I where split.
        freed = sim.end[split] if is_split else sim.end[last]
        events += [(sim.start[Action(FORWARD, stage, m)], held), (freed, -held)]
        if last.kind != FORWARD and (stage, m) not in kept:
            first_back = split if is_split else last
            start, end = sim.start[first_back], sim.end[first_back]
            f = sim.end[Action(FORWARD, stage, m)] - sim.start[Action(FORWARD, stage, m)]
            replayed = start + (end - start) * f / max(f + end - start, 1e-12)
            events += [(replayed, internal), (freed, -internal)]
        if is_split:
            after = (boundary + internal if weight_held is None else weight_held) + deferred
            steps = RAMP_STEPS if ramp else 1
            start, end = sim.start[last], sim.end[last]
            shares = [after * (i + 1) // steps - after * i // steps for i in range(steps)]
            events += [(freed, after)]
            events += [(start + (end - start) * (i + 1) / steps, -b) for i, b in enumerate(shares)]
    return events


def DeviceMemory(stages: Sequence[StageMemory]) -> StageMemory:
    """The memory of a device that runs `stages` (Estimate's entries for them): weights,
    gradients and slots add up; activations peak over the stages' events together; a
    device runs one backward at a time, so the largest workspace; peak_alive is the
    most (stage, micro-batch) pairs alive at once. Its total is the joint peak of all
    of them over the step (HostMemory of this one device) where the stages have step
    events."""
    acts = simulate.PeakOf([e for s in stages for e in s.events])
    timed = all(s.step_events or not s.gradients for s in stages)
    return StageMemory(
        weights=sum(s.weights for s in stages),
        gradients=sum(s.gradients for s in stages),
        optimizer_slots=sum(s.optimizer_slots for s in stages),
        activations=acts + sum(s.activations - simulate.PeakOf(s.events) for s in stages),
        workspace=max(s.workspace for s in stages),
        update=sum(s.update for s in stages),
        received=sum(s.received for s in stages),
        peak_alive=simulate.PeakOf([e for s in stages for e in s.alive_events]),
        joint=HostMemory([stages]) if timed else None,
    )


def StepEvents(
    sim: Any,
    stage: int,
    gradients: int,
    spaces: Workspaces,
    update: int = 0,
    stage_devices: Sequence[int] | None = None,
    received: int = 0,
) -> list[tuple[float, int]]:
    """(time, +bytes or -bytes) in `sim` of stage `stage`'s gradients, workspace
    (`spaces`, StageWorkspaces) and optimizer update. The workspace is held while each
    backward action runs: a B's, the first B's (which makes the gradients as it goes,
    held by it), an I's or a W's, but not the first W's (the gradients it makes are the
    running sum, whole from its start). With `stage_devices` (each stage's device), a B
    that no other device's action overlaps holds what a B alone holds. The gradients are
    whole from the end of the first B, or from the start of the first W where the
    backward is split (an I makes none). The update (`update` bytes) comes at the
    step's end, after every device's last action. `received` (StageMemory.received) is
    held from the start of the last action that makes gradients to the step's end."""
    backs = [a for a in sim.start if a.stage == stage and a.kind != FORWARD]
    makers = [
        a for a in backs
        if a.kind != BACKWARD_INPUT
        or Action(BACKWARD_WEIGHT, stage, a.micro_batch) not in sim.start
    ]  # fmt: skip
    if not makers:
        return []
    first = min(makers, key=lambda a: (sim.start[a], a))
    held = {BACKWARD: spaces.backward, BACKWARD_INPUT: spaces.input, BACKWARD_WEIGHT: spaces.weight}
    others = _OtherDevices(sim, stage, stage_devices)
    events = []
    for a in backs:
        bytes_ = held[a.kind]
        if a == first:
            # The first maker's weight gradients become the running sum: a first B's walk
            # keeps each; a first W holds nothing beside the gradients, whole from its start.
            bytes_ = 0 if a.kind == BACKWARD_WEIGHT else spaces.first
        alone = others is not None and not any(
            s < sim.end[a] and e > sim.start[a] for s, e in others
        )  # fmt: skip
        if a.kind == BACKWARD and spaces.backward_alone is not None and alone:
            bytes_ = spaces.first_alone if a == first else spaces.backward_alone
        if bytes_:
            events += [(sim.start[a], bytes_), (sim.end[a], -bytes_)]
    whole = sim.start[first] if first.kind == BACKWARD_WEIGHT else sim.end[first]
    events += [(whole, gradients)]
    if received:
        last = max(makers, key=lambda a: (sim.start[a], a))
        events += [(sim.start[last], received), (sim.makespan, -received)]
    return events + ([(sim.makespan, update)] if update else [])


def _OtherDevices(
    sim: Any, stage: int, stage_devices: Sequence[int] | None
) -> list[tuple[float, float]] | None:
    """(start, end) of every action on a device other than `stage`'s; None where the
    devices are not known (every B then counts as loaded)."""
    if stage_devices is None:
        return None
    mine = stage_devices[stage]
    return [(sim.start[b], sim.end[b]) for b in sim.start if stage_devices[b.stage] != mine]


def HostMemory(per_device: Sequence[Sequence[StageMemory]]) -> int:
    """The peak of one allocator that serves every device (logical devices of one host,
    as this repository's CPU tests and benchmarks run): every stage's weights and slots,
    and its activations, gradients and workspace at their joint peak over the
    schedule's time (one simulation gives every stage's events, StepEvents). At most
    the sum of DeviceMemory's totals, which peak at different times; that sum where a
    stage has no step events."""
    stages = [s for ms in per_device for s in ms]
    if not all(s.step_events or not s.gradients for s in stages):
        return sum(DeviceMemory(ms).total for ms in per_device)  # each its parts' sum
    events = [e for s in stages for e in s.events + s.step_events]
    held = sum(s.activations - simulate.PeakOf(list(s.events)) for s in stages)
    static = sum(s.weights + s.optimizer_slots for s in stages)
    return static + held + simulate.PeakOf(events)


def _Spec(x: Any, key: str = "", float_dtype: tf.DType = tf.float32) -> Any:
    """A whole-batch input as tf.TensorSpec (NestedMaps keep their structure). A bare
    shape is `float_dtype` (the cells' compute dtype), except under a key ending in
    'ids' or 'labels': int32, as lingpipe's tasks feed token ids and labels."""
    if isinstance(x, dict):
        return type(x)({k: _Spec(v, k, float_dtype) for k, v in x.items()})
    if isinstance(x, tf.TensorSpec):
        return x
    dtype = tf.int32 if key.endswith(("ids", "labels")) else float_dtype
    return tf.TensorSpec(base_layer.ToShape(x), dtype)


def MicroBatchSpecs(specs: tuple, num_micro_batches: int, batch_dim: int) -> tuple:
    """`specs` (the whole batch's tf.TensorSpecs) for the largest micro-batch, cut by
    lingpipe.pipeline.step.micro_batch's rules, as the pipeline splits the inputs."""
    batch = micro_batch.BatchSize(specs, batch_dim, "memory estimate")
    micro = micro_batch.Sizes(batch, num_micro_batches, "memory estimate")[0]

    def Cut(s: tf.TensorSpec) -> tf.TensorSpec:
        if not micro_batch.IsBatched(s, batch, batch_dim):
            return s
        dims = s.shape.as_list()
        dims[batch_dim] = micro
        return tf.TensorSpec(dims, s.dtype)

    return tf.nest.map_structure(Cut, specs)


def _WholeBatch(parent_p: hyperparams.Params, cell_params: Sequence[Any], input_specs: tuple):
    """The pipeline's inputs as tf.TensorSpecs: bare shapes take the dtype that the first
    cell computes in."""
    first = cell_params[0] if cell_params else parent_p
    compute = getattr(first, "fprop_dtype", None) or parent_p.fprop_dtype or parent_p.dtype
    return tuple(_Spec(x, "", tf.as_dtype(compute)) for x in input_specs)


def TracedFor(
    parent_p: hyperparams.Params,
    cell_params: Sequence[Any],
    input_specs: tuple,
    num_micro_batches: int,
    batch_dim: int = 0,
) -> list[CellMemory]:
    """TraceCells of the cells for the largest micro-batch of `input_specs` (the whole
    batch) cut in `num_micro_batches`: what Estimate traces."""
    whole = _WholeBatch(parent_p, cell_params, input_specs)
    specs = MicroBatchSpecs(whole, num_micro_batches, batch_dim)
    return TraceCells(parent_p, cell_params, specs)


def Estimate(
    parent_p: hyperparams.Params,
    cell_params: Sequence[Any],
    stage_cells: Sequence[Sequence[int]],
    input_specs: tuple,
    sched: Schedule,
    kept: set,
    optimizer: Any = None,
    batch_dim: int = 0,
    traced: list[CellMemory] | None = None,
    replicas: int = 1,
) -> list[StageMemory]:
    """Per stage, its memory in a training step (module doc), from params alone.

    Args:
      parent_p: the pipeline's params (cells inherit its dtype and init).
      cell_params: every cell's params, in order.
      stage_cells: the cell indices of each stage, as partitioned.
      input_specs: the pipeline's inputs for a whole batch (tf.TensorSpecs or shapes).
      sched: the schedule of the step; kept: the (stage, micro-batch) pairs whose
        activations are kept (PipeliningLayer.KeptActivations).
      optimizer: see SlotBytes; its update, update_memory.UpdateCostOf.
      batch_dim: the inputs' batch dimension.
      traced: TraceCells of these cells for this micro-batch size, if already made (the
        planner reuses them over the schedules it tries).
      replicas: R; above 1, the stages are replica 0's, which receive the other
        replicas' gradients to average them (module doc: received).
        On logical devices of one process those are the other replicas' own tensors,
        not copies: HostMemory of such a process sums stages estimated with R = 1.
    """
    if len(stage_cells) != sched.num_stages:
        raise ValueError(
            f"memory estimate: expected one list of cells per stage of the schedule "
            f"({sched.num_stages}), received {len(stage_cells)}"
        )
    whole = _WholeBatch(parent_p, cell_params, input_specs)
    cells = traced
    if cells is None:
        cells = TracedFor(parent_p, cell_params, input_specs, sched.num_micro_batches, batch_dim)
    sim = simulate.Simulate(sched)
    batch_bytes = sum(op_walk.Bytes(s) for s in tf.nest.flatten(whole))
    update_cost = update_memory.UpdateCostOf(optimizer)
    out = []
    for k, idx in enumerate(stage_cells):
        mine = [cells[i] for i in idx]
        boundary, internal = StageActivations(mine)
        shapes = [s for c in mine for s in c.trainable_shapes]
        size = mine[0].dtype_size
        # Stage 0's inputs are slices of the batch, counted once as batch_bytes below.
        boundary = boundary if k else 0
        deferred = sum(c.deferred_bytes for c in mine)
        for_w = WeightHeld(mine, boundary, internal)
        gradients = sum(map(math.prod, shapes)) * size
        largest = max(map(math.prod, shapes), default=0) * size
        update = update_cost.Bytes(largest)
        received = (replicas - 1) * gradients + largest if replicas > 1 else 0
        spaces = StageWorkspaces(Units(mine), mine[-1].output_bytes, mine[0].input_bytes)
        events = ActivationEvents(
            sim, sched.num_micro_batches, k, kept, boundary, internal, deferred, for_w
        )
        alive = ActivationEvents(sim, sched.num_micro_batches, k, set(), 1, 0, ramp=False)
        out.append(
            StageMemory(
                weights=sum(c.weight_bytes for c in mine),
                gradients=gradients,
                optimizer_slots=SlotBytes(optimizer, shapes, size),
                activations=simulate.PeakOf(events) + (batch_bytes if k == 0 else 0),
                workspace=spaces.most if sched.has_backward else 0,
                peak_alive=sim.peak_alive[k],
                events=tuple(events),
                alive_events=tuple(alive),
                step_events=tuple(
                    StepEvents(sim, k, gradients, spaces, update, sched.stage_devices, received)
                ),
                update=update if sched.has_backward else 0,
                received=received if sched.has_backward else 0,
            )
        )
    return out


def MeasuredPeaks(devices: Sequence[str]) -> dict[str, int]:
    """The peak bytes TensorFlow's allocator saw since the last reset, per device:
    {device: bytes} on accelerators; on CPU, where one allocator serves every logical
    device, one entry {'all CPU devices (one allocator)': bytes}. Reset with
    ResetPeaks(devices) before the step to measure."""
    return {
        key: int(tf.config.experimental.get_memory_info(allocator)["peak"])
        for key, allocator in _Allocators(devices).items()
    }


def ResetPeaks(devices: Sequence[str]) -> None:
    """Resets the peaks that MeasuredPeaks(devices) reads (on CPU, the one allocator's)."""
    for allocator in sorted(set(_Allocators(devices).values())):
        tf.config.experimental.reset_memory_stats(allocator)


def _Allocators(devices: Sequence[str]) -> dict[str, str]:
    """{what MeasuredPeaks reports (see there): the allocator's device, 'GPU:1'}."""
    names = [tf.DeviceSpec.from_string(d) for d in devices]
    if all((n.device_type or "CPU").upper() == "CPU" for n in names):
        return {"all CPU devices (one allocator)": "CPU:0"}
    return {d: f"{n.device_type}:{n.device_index or 0}" for d, n in zip(devices, names)}


def Note(sched: Schedule, remat: remat_lib.Remat, optimizer: Any) -> str:
    """What an estimate assumed, in words: schedule, remat (a policy, or one per stage)
    and the optimizer's slots."""
    if optimizer is None:
        opt = "no optimizer slots"
    elif isinstance(optimizer, (int, float)):
        opt = f"{optimizer:g} optimizer slots per weight"
    else:
        opt = f"optimizer {(getattr(optimizer, 'cls', None) or type(optimizer)).__name__}"
    return (
        f"schedule={sched.name} K={sched.num_devices} M={sched.num_micro_batches} "
        f"remat={remat_lib.Text(remat)}, {opt}"
    )
