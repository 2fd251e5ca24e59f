"""The executor: runs a schedule's forwards and backwards, creating the backward itself.

    result = executor.Run(sched, stages, micro_inputs, loss_fn, micro_loss_inputs,
                          keep=..., context=...)

or in two halves, for a caller whose tape asks for the gradient later (the
schedule's forwards all come first: fill-drain, or forward-only):

    step = executor.Forward(sched, stages, micro_inputs, keep, context)
    step.Outputs()                        # the last stage's outputs, per micro-batch
    result = executor.Backward(step, dys)  # the rest, from the outputs' gradients

For every action of `sched` (in an order its simulation says is valid) the
executor creates the action's ops on its stage's device, after the previous
action of the same device (a control dependency on what that action produced),
so each device follows its list; nothing else is ordered but the data.

- F s m: the stage's forward of micro-batch m. When its activations are kept
  ((s, m) in `keep`), under a tape; else without one (the backward replays it). On
  the last stage `loss_fn(outputs, loss_inputs_m)` gives the micro-batch's metrics.
- B s m: the gradient of the stage's inputs and weights, from the gradient of its
  outputs that stage s+1's backward produced (on the last stage, from the loss, or
  from the outputs' gradients given to Backward), replaying the forward first if it
  was not kept. The weights' gradient is added to the stage's running sum on its device.
- I s m / W s m (zero bubble): B in two. I computes the inputs' gradient and sends
  it on; the ops that only the weights' gradient needs are held back (a control
  input each) until W's turn on the device.

A weight's gradient is summed over the micro-batches in float32
(lingpipe.pipeline.step.gradient_sums). An embedding's gradient (tf.IndexedSlices) is made
dense for the sum, or, with `sparse` (Keras' optimizers), kept as the plain model's
slices.

An exception raised while an action is built or run is raised again (same type
where it can be) naming the action, its device and that device's list with the
action marked.

The loss of the batch is the weighted mean of the micro-batches' losses, as the
task's (value, weight) metrics say: sum_m loss_m w_m / sum_m w_m. Each backward
starts from d(loss_m w_m), so it needs no other micro-batch; the sums are scaled
by 1 / sum_m w_m at the end, on each gradient's device. The weights w_m are
counts (tokens, examples) and get no gradient.

Mixed precision (lingpipe.pipeline.step.precision): each micro-batch's loss and each
weight gradient are taken to float32 before they are summed. With a `loss_scale`
(float16's dynamic loss scaling) each backward starts from d(loss_m w_m * loss_scale),
so small gradients survive float16, and the final scaling by 1 / (sum_m w_m *
loss_scale) undoes it, in float32: the gradients returned are unscaled, and not
finite where the scaled ones overflowed.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Collection, Sequence
from typing import Any

import tensorflow as tf

from lingpipe.nested_map import NestedMap
from lingpipe.pipeline.schedules import simulate
from lingpipe.pipeline.schedules.schedule import BACKWARD_INPUT, BACKWARD_WEIGHT, FORWARD, Schedule
from lingpipe.pipeline.step import gradient_sums, precision
from lingpipe.pipeline.step.stage_context import Entered, StageContext

__all__ = [
    "Backward",
    "CheckMetrics",
    "Forward",
    "Result",
    "Run",
    "Stage",
    "WeightOnlyOps",
]


@dataclasses.dataclass
class Stage:
    """One stage for the executor: `run(weights, inputs) -> outputs` on its device,
    `weights` being the leaves (variables or tensors) whose gradient the stage sums."""

    weights: list
    run: Callable[[list, Any], Any]


@dataclasses.dataclass
class Result:
    """What a step of the executor gives.

    Attributes:
      metrics: NestedMap of (value, weight): the weighted means over micro-batches.
      weight_grads: per stage, the gradient of each of its weights (None where none).
      input_grads: per micro-batch, a flat list aligned with tf.nest.flatten of its
        inputs (None for leaves that are not floating point or get no gradient).
      extra_grads: {variable.ref(): gradient} of variables that loss_fn read.
    """

    metrics: NestedMap
    weight_grads: list[list]
    input_grads: list[list]
    extra_grads: dict


def _IsFloat(x: Any) -> bool:
    return isinstance(x, (tf.Tensor, tf.Variable)) and x.dtype.is_floating


def CheckMetrics(metrics: Any, where: str = "loss_fn") -> NestedMap:
    """`metrics` as a NestedMap of (value, weight) scalar pairs with `loss`, else ValueError."""
    if not isinstance(metrics, dict) or "loss" not in metrics:
        got = sorted(metrics) if isinstance(metrics, dict) else type(metrics).__name__
        raise ValueError(
            f"{where} must return a NestedMap of (value, weight) pairs with 'loss', received {got}"
        )
    bad = [k for k, v in metrics.items() if not isinstance(v, (tuple, list)) or len(v) != 2]
    if bad:
        raise ValueError(
            f"{where} must return each metric as a (value, weight) pair, received "
            + ", ".join(f"{k}={metrics[k]!r}" for k in sorted(bad))
        )
    rank = tf.convert_to_tensor(metrics["loss"][0]).shape.rank
    if rank not in (None, 0):
        raise ValueError(f"{where}: expected loss to be a scalar, received rank {rank}")
    return NestedMap({k: tuple(v) for k, v in metrics.items()})


class _Step:
    """The state of one traced step: what each action left for the next ones."""

    def __init__(
        self,
        sched,
        stages,
        micro_inputs,
        loss_fn,
        loss_inputs,
        keep,
        context,
        loss_scale=None,
        sparse=False,
    ):
        self.sched, self.stages, self.keep, self.context = sched, stages, keep, context
        self.loss_scale, self.sparse = loss_scale, sparse
        self.micro_inputs, self.loss_fn, self.loss_inputs = micro_inputs, loss_fn, loss_inputs
        self.outputs: dict = {}  # (s, m) -> forward outputs
        self.kept: dict = {}  # (s, m) -> (tape, outputs, objective) of a kept forward
        self.input_grads: dict = {}  # (s, m) -> flat gradients of the stage's inputs
        self.pending: dict = {}  # (s, m) -> (weight grads, extra grads, held-back ops) of an I
        self.sums: list[list] = [[None] * len(st.weights) for st in stages]
        self.extra: dict = {}
        self.metrics: list = [None] * sched.num_micro_batches
        self.eager = tf.executing_eagerly()
        self.chain: list[list] = [[] for _ in range(sched.num_devices)]
        self.rest: list = []  # the actions Backward runs

    def Outputs(self) -> list:
        """The last stage's outputs, one structure per micro-batch."""
        return [self.outputs[(self.sched.num_stages - 1, m)] for m in range(len(self.metrics))]

    def Act(self, actions: Sequence[Any]) -> None:
        """Creates `actions` in order, each on its device after the device's previous one."""
        for a in actions:
            s, m, d = a.stage, a.micro_batch, self.sched.DeviceOf(a.stage)
            ctx = self.context(s, m)
            after = [] if self.eager else self.chain[d]
            try:
                with (
                    tf.device(ctx.device),
                    tf.name_scope(f"{a.kind}_s{s}_mb{m}"),
                    tf.control_dependencies(after),
                ):
                    if a.kind == FORWARD:
                        done = self.DoForward(s, m)
                    elif a.kind == BACKWARD_INPUT:
                        done = self.DoBackwardInput(s, m)
                    elif a.kind == BACKWARD_WEIGHT:
                        done = self.DoBackwardWeight(s, m, after)
                    else:
                        done = self.DoBackward(s, m)
                    if done and not self.eager:
                        # The device's next action waits on this one op: its ops that read
                        # no tensor of their own action (every weight read) each took a
                        # control edge per tensor here (379k edges in a small AmoebaNet).
                        with tf.control_dependencies(done):
                            done = [tf.no_op(name="done")]  # on the action's device
            except Exception as e:
                raise _Named(e, self.sched, a, ctx.device) from e
            self.chain[d] = done or self.chain[d]

    def Inputs(self, s: int, m: int) -> Any:
        return self.micro_inputs[m] if s == 0 else self.outputs[(s - 1, m)]

    def Forward(self, s: int, m: int, ctx: StageContext) -> tuple[Any, Any, Any]:
        """Runs the stage (and the loss on the last stage) in `ctx`: (tape, outputs, objective),
        the objective, where the micro-batch's backward starts, being loss_m w_m (* loss_scale)."""
        stage, inputs = self.stages[s], self.Inputs(s, m)
        tape = tf.GradientTape() if ctx.recompute or (s, m) in self.keep else None
        with tape or contextlib.nullcontext(), Entered(ctx):
            if tape is not None:
                tape.watch([x for x in tf.nest.flatten(inputs) + stage.weights if _IsFloat(x)])
            outputs = ctx.annotate(stage.run(stage.weights, inputs))
            objective = None
            if s == self.sched.num_stages - 1 and self.loss_fn is not None:
                metrics = CheckMetrics(self.loss_fn(outputs, self.loss_inputs[m]))
                if not ctx.recompute:
                    self.metrics[m] = metrics
                loss, weight = metrics.loss
                loss = precision.ForAccumulation(tf.convert_to_tensor(loss))
                objective = loss * tf.stop_gradient(tf.cast(weight, loss.dtype))
                if self.loss_scale is not None:
                    objective *= tf.stop_gradient(tf.cast(self.loss_scale, loss.dtype))
        return tape, outputs, objective

    def DoForward(self, s: int, m: int) -> list:
        tape, outputs, objective = self.Forward(s, m, self.context(s, m))
        self.outputs[(s, m)] = outputs
        if tape is not None:
            self.kept[(s, m)] = (tape, outputs, objective)
        return tf.nest.flatten(outputs) + ([objective] if objective is not None else [])

    def Replay(self, s: int, m: int) -> tuple[Any, Any, Any]:
        """Forward's (tape, outputs, objective) again, for a backward whose forward kept
        nothing. In a graph the replay waits for the gradient it serves (one of the next
        stage's input gradients, taken through an op of this action): otherwise it
        would run as soon as its device is free and hold the micro-batch's activations
        through the later stages' backwards, what recomputation is meant to save."""
        grads = [] if self.eager else self.input_grads.get((s + 1, m), [])
        ready = [g for g in grads if isinstance(g, tf.Tensor)][:1]
        with tf.control_dependencies([tf.identity(g) for g in ready]):
            return self.Forward(s, m, self.context(s, m).Replay())

    def Gradients(self, s: int, m: int) -> tuple[list, list, dict]:
        """(input grads, weight grads, extra grads) of stage s on micro-batch m."""
        kept = self.kept.pop((s, m), None)
        if kept is None:
            kept = self.Replay(s, m)
        tape, outputs, objective = kept
        stage, flat_in = self.stages[s], tf.nest.flatten(self.Inputs(s, m))
        if objective is not None:
            targets, dys = [objective], None
        else:
            pairs = [
                (o, dy)
                for o, dy in zip(tf.nest.flatten(outputs), self.input_grads.pop((s + 1, m)))
                if dy is not None and _IsFloat(o)
            ]
            targets, dys = [o for o, _ in pairs], [dy for _, dy in pairs]
        weights = [w for w in stage.weights if _IsFloat(w)]
        # Variables read but not among the weights (by the loss, or a cell's own read).
        known = {w.ref() for w in weights if isinstance(w, tf.Variable)}
        extras = [v for v in tape.watched_variables() if v.ref() not in known]
        sources = [x for x in flat_in if _IsFloat(x)] + weights + extras
        grads = tape.gradient(
            targets,
            sources,
            output_gradients=dys,
            unconnected_gradients=tf.UnconnectedGradients.NONE,
        )
        taken = iter(grads)  # in the order of `sources`; None where a leaf is not floating point
        input_grads = [next(taken) if _IsFloat(x) else None for x in flat_in]
        sparse = self.sparse
        weight_grads = [
            gradient_sums.Summand(next(taken), sparse, flat_in) if _IsFloat(w) else None
            for w in stage.weights
        ]
        extra_grads = {v.ref(): gradient_sums.Summand(next(taken), sparse, flat_in) for v in extras}
        return input_grads, weight_grads, extra_grads

    def DoBackward(self, s: int, m: int) -> list:
        return self.DoBackwardInput(s, m, hold=False) + self.DoBackwardWeight(s, m, [])

    def DoBackwardInput(self, s: int, m: int, hold: bool = True) -> list:
        """The inputs' gradient, sent on; the weights' waits in `pending` for W, with (if
        `hold`, in a graph) the ops that only it needs."""
        ctx = self.context(s, m)
        graph = None if self.eager or not hold else tf.compat.v1.get_default_graph()
        first = 0 if graph is None else len(graph.get_operations())
        input_grads, weight_grads, extra_grads = self.Gradients(s, m)
        held = []
        if graph is not None:
            created = graph.get_operations()[first:]
            weight_only = gradient_sums.Tensors(weight_grads + list(extra_grads.values()))
            held = WeightOnlyOps(created, input_grads, weight_only)
        self.input_grads[(s, m)] = ctx.annotate(input_grads)
        self.pending[(s, m)] = (ctx.annotate(weight_grads), extra_grads, held)
        return [g for g in self.input_grads[(s, m)] if g is not None]

    def DoBackwardWeight(self, s: int, m: int, after: Sequence[Any]) -> list:
        weight_grads, extra_grads, held = self.pending.pop((s, m))
        for op in held:
            for gate in after:  # the device's previous action's op (Act)
                op._add_control_input(gate)  # noqa: SLF001 (W waits for its turn)
        self.sums[s] = [gradient_sums.Add(a, g) for a, g in zip(self.sums[s], weight_grads)]
        for ref, g in extra_grads.items():
            self.extra[ref] = gradient_sums.Add(self.extra.get(ref), g)
        return gradient_sums.Tensors(self.sums[s] + list(self.extra.values()))


def _Ancestors(tensors: list, within: set) -> set:
    seen, todo = set(), [t.op for t in tensors if t is not None]
    while todo:
        op = todo.pop()
        if op in seen or op not in within:
            continue
        seen.add(op)
        todo.extend(t.op for t in op.inputs)
        todo.extend(op.control_inputs)
    return seen


def WeightOnlyOps(created: Sequence[Any], input_grads: list, weight_grads: list) -> set:
    """The ops among `created` (a backward's) that the weight gradients need and the input
    gradients do not: what I holds back for W. The memory estimate reads the same ops
    (lingpipe.pipeline.observe.memory)."""
    within = set(created)
    return _Ancestors(weight_grads, within) - _Ancestors(input_grads, within)


def Run(
    sched: Schedule,
    stages: Sequence[Stage],
    micro_inputs: Sequence[Any],
    loss_fn: Callable[[Any, Any], NestedMap],
    micro_loss_inputs: Sequence[Any],
    keep: Collection[tuple[int, int]],
    context: Callable[[int, int], StageContext],
    loss_scale: tf.Tensor | None = None,
    sparse: bool = False,
) -> Result:
    """Runs `sched` (see the module docstring).

    Args:
      sched: the schedule; sched.num_stages == len(stages).
      stages: what each stage runs, with its weights.
      micro_inputs: the first stage's inputs, one structure per micro-batch.
      loss_fn: (outputs, loss inputs) -> NestedMap of (value, weight) metrics with 'loss'.
      micro_loss_inputs: loss_fn's second argument, one per micro-batch.
      keep: the (stage, micro-batch) pairs whose activations are kept (remat.Kept).
      context: the StageContext of stage s on micro-batch m.
      loss_scale: a float scalar, float16's loss scale (None: 1).
      sparse: an embedding's gradient (tf.IndexedSlices) stays slices, concatenated
        over the micro-batches (as Keras' optimizers want it); else it is made dense.
    """
    step = _Step(
        sched, stages, micro_inputs, loss_fn, micro_loss_inputs, keep, context, loss_scale, sparse
    )
    step.Act(simulate.Simulate(sched).order)
    return _Finish(step)


def Forward(
    sched: Schedule,
    stages: Sequence[Stage],
    micro_inputs: Sequence[Any],
    keep: Collection[tuple[int, int]],
    context: Callable[[int, int], StageContext],
) -> _Step:
    """Run's first half (see the module docstring): the forwards of `sched`, no loss."""
    order = simulate.Simulate(sched).order
    first = next((i for i, a in enumerate(order) if a.kind != FORWARD), len(order))
    late = [a for a in order[first:] if a.kind == FORWARD]
    if late:
        raise ValueError(
            f"executor.Forward: schedule {sched.name!r} runs {late[0]} after a backward; "
            "expected every forward first (a fill-drain or forward-only schedule)"
        )
    step = _Step(sched, stages, micro_inputs, None, None, keep, context)
    step.Act(order[:first])
    step.rest = order[first:]
    return step


def Backward(step: _Step, output_grads: Sequence[Any]) -> Result:
    """The backwards of Forward's `step`, the last stage's starting from `output_grads`
    (per micro-batch, like step.Outputs()); Result.metrics is empty, nothing is scaled."""
    for m, dys in enumerate(output_grads):
        step.input_grads[(step.sched.num_stages, m)] = tf.nest.flatten(dys)
    step.Act(step.rest)
    return _Finish(step)


def _Named(error: Exception, sched: Schedule, action: Any, device: str) -> Exception:
    """`error` as the module docstring says, in one line (as the trainer's errors are)."""
    d = sched.DeviceOf(action.stage)
    listed = ", ".join(f">> {a} <<" if a == action else str(a) for a in sched.device_actions[d])
    message = (
        f"pipeline: {action} on device {d} ({device}) failed: {type(error).__name__}: {error}; "
        f"device {d} of schedule {sched.name!r} runs: {listed}"
    )
    if isinstance(error, tf.errors.OpError):
        return type(error)(error.node_def, error.op, message)
    try:
        return type(error)(message)
    except Exception:  # an exception type that takes other arguments
        return ValueError(message)


def _Finish(step: _Step) -> Result:
    """The metrics' weighted means; the gradients scaled as the module docstring says."""
    context, last = step.context, step.sched.num_stages - 1
    metrics, scale = NestedMap(), None
    if step.loss_fn is not None:
        with tf.device(context(last, 0).device), tf.name_scope("metrics"):
            for name in step.metrics[0]:
                pairs = [[tf.cast(x, tf.float32) for x in mm[name]] for mm in step.metrics]
                total = tf.add_n([w for _, w in pairs])
                weighted = tf.add_n([v * w for v, w in pairs])
                metrics[name] = (tf.math.divide_no_nan(weighted, total), total)
            total = metrics.loss[1]
            if step.loss_scale is not None:
                total = total * tf.cast(step.loss_scale, tf.float32)
            scale = tf.math.divide_no_nan(1.0, total)

    # Every device's last action: a gradient is handed on only once the whole step has
    # run. TensorFlow orders a variable's update after the ops that read it, not after the
    # ops that use what they read; Keras' one IdentityN over all gradients would order
    # each update after every gradient, but Grappler removes it. Without this, an update
    # at times changed what a later backward of the same step used of its read (1 fit in
    # ~20 on logical CPUs; tests/pipeline/test_step_end.py reads the order from the graph).
    ends = [] if step.eager else [op for chain in step.chain for op in chain]

    def Scaled(g: Any, device: str) -> Any:
        if g is None:
            return None
        with tf.device(device), tf.control_dependencies(ends):
            g = gradient_sums.Finished(g) if scale is None else gradient_sums.Scaled(g, scale)
            return tf.nest.map_structure(tf.identity, g, expand_composites=True) if ends else g

    weight_grads = []
    for s, sums in enumerate(step.sums):
        with tf.name_scope(f"scale_s{s}"):
            weight_grads.append([Scaled(g, context(s, 0).device) for g in sums])
    first = context(0, 0).device
    input_grads = [
        [Scaled(g, first) for g in step.input_grads.pop((0, m))]
        for m in range(step.sched.num_micro_batches)
    ]
    extra = {ref: Scaled(g, ref.deref().device) for ref, g in step.extra.items()}
    return Result(metrics, weight_grads, input_grads, extra)
