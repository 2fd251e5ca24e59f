"""A built Keras 3 model's graph as a flat list of nodes, cut into pipeline stages.

    graph = Trace(model)                      # Functional, or keras.Sequential
    cut = MakeCut(graph, num_stages=4, partition='flops')  # or split_points=['conv3_block1_1_conv']
    print(graph_report.Report(cut, devices, num_micro_batches=8))  # lingpipe.keras.graph_report

`Trace` walks the model's nodes (Keras' `_nodes_by_depth`, deepest first: a
topological order) and inlines nested Functional models (and keras.Sequential
ones): their layers become nodes of the outer graph, so a cut can fall inside a
backbone. A layer called at several places (shared) gives several nodes of the
one layer. Every tensor of the graph gets a key; a nested model's inputs and
outputs are aliases of the outer tensors it was called on and produced.

`MakeCut` splits the node list into contiguous stages by cost (lingpipe.pipeline.
partition's min-max cut) or at layer names, and computes, for each boundary, the
tensors alive across it: produced before it (or a model input) and used after it
(or a model output). They travel to the next stage with the activations.

This module reads the graph and cuts it; what a node costs under a partition policy,
the profiler and the report are the engine's (lingpipe.pipeline.planning.costs, partition,
report), shared with PipeliningLayer: a node here is what a cell is there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras.src.models import functional as keras_functional

from lingpipe.pipeline.planning import costs
from lingpipe.pipeline.planning import partition as partition_lib

__all__ = [
    "CallKey",
    "CallNode",
    "Cut",
    "CutBytes",
    "ExampleSpecs",
    "FirstUseParams",
    "Graph",
    "GraphNode",
    "LiveTensors",
    "MakeCut",
    "NodeCall",
    "NodeCosts",
    "NodeFlops",
    "NodeParams",
    "POLICIES",
    "ProfileNodes",
    "SampleInput",
    "TensorBytes",
    "TensorName",
    "Trace",
    "TrainableVariables",
]

POLICIES = costs.POLICIES


@dataclasses.dataclass
class GraphNode:
    """One call of a Keras operation in the model's graph.

    Attributes:
      index: position in the topological order.
      name: the layer's name, prefixed by the nested models' names ('backbone/conv1').
      operation: the Keras layer (or keras.ops operation) called.
      node: Keras' Node of the call (its `arguments` are filled in with values).
      arg_keys: key of each KerasTensor in node.arguments.keras_tensors.
      out_keys: key of each output tensor, in order.
      out_shapes: the outputs' shapes, batch dim None.
    """

    index: int
    name: str
    operation: Any
    node: Any
    arg_keys: list
    out_keys: list
    out_shapes: list

    @property
    def is_layer(self) -> bool:
        return isinstance(self.operation, keras.layers.Layer)


@dataclasses.dataclass
class Graph:
    """A model's graph: nodes in topological order, the keys of its inputs and outputs."""

    model: Any
    nodes: list[GraphNode]
    input_keys: list  # flat, in the order of model.inputs
    output_keys: list  # flat, in the order of model.outputs
    shapes: dict  # key -> shape (batch dim None)
    dtypes: dict  # key -> dtype name

    def LayerNames(self) -> list[str]:
        return [n.name for n in self.nodes]


def _Functional(model: Any, where: str) -> Any:
    """The Functional graph of `model` (a keras.Sequential's own), else a one-line error."""
    if isinstance(model, keras.Sequential):
        functional = getattr(model, "_functional", None)
        if functional is None:
            raise ValueError(
                f"{where}: received keras.Sequential {model.name!r} that is not built; expected "
                "a model with known inputs: start it with keras.Input(shape) or call "
                "model.build((None, ...)) first"
            )
        return functional
    if isinstance(model, keras.Model) and hasattr(model, "_nodes_by_depth"):
        RefuseOverrides(model, ("call",), where)
    if not isinstance(model, keras.Model) or not hasattr(model, "_nodes_by_depth"):
        raise TypeError(
            f"{where}: expected a built Keras 3 Functional model or keras.Sequential, received "
            f"{type(model).__name__} {getattr(model, 'name', model)!r:.80} (a subclassed "
            "keras.Model has no graph to cut)"
        )
    return model


def RefuseOverrides(model: Any, hooks: tuple[str, ...], where: str) -> None:
    """One line if `model`'s class overrides one of keras.Model's `hooks` outside Keras
    itself: the pipeline runs the model's graph with its own step, never that code."""
    for hook in hooks:
        method = getattr(type(model), hook, None)
        module = getattr(method, "__module__", "") or ""
        if method is not None and not module.startswith("keras."):
            runs = (
                "the model's graph, layer by layer"
                if hook == "call"
                else "the model's graph with a training step of its own"
            )
            raise ValueError(
                f"{where}: {type(model).__name__} {model.name!r} overrides keras.Model.{hook} "
                f"({module}.{method.__qualname__}), which a pipeline never runs: it runs "
                f"{runs}; expected {hook} left to Keras (that code in a layer, or in "
                "compile's loss and metrics)"
            )


def _IsNested(operation: Any) -> bool:
    return isinstance(operation, keras.Sequential) or (
        isinstance(operation, keras.Model) and hasattr(operation, "_nodes_by_depth")
    )


class _Tracer:
    def __init__(self) -> None:
        self.nodes: list[GraphNode] = []
        self.alias: dict = {}
        self.shapes: dict = {}
        self.dtypes: dict = {}
        self.calls: dict = {}  # id(nested model) -> times inlined

    def Key(self, scope: str, tensor: Any) -> Any:
        key = (scope, id(tensor))
        while key in self.alias:
            key = self.alias[key]
        self.shapes.setdefault(key, tuple(tensor.shape))
        self.dtypes.setdefault(key, str(tensor.dtype))
        return key

    def Walk(self, functional: Any, scope: str, prefix: str) -> None:
        for depth in sorted(functional._nodes_by_depth, reverse=True):  # noqa: SLF001
            for node in functional._nodes_by_depth[depth]:  # noqa: SLF001
                if not node.operation or node.is_input:
                    continue
                arg_keys = [self.Key(scope, t) for t in node.arguments.keras_tensors]
                out_keys = [self.Key(scope, t) for t in node.outputs]
                op = node.operation
                if _IsNested(op):
                    self.Inline(op, node, arg_keys, out_keys, prefix)
                    continue
                self.nodes.append(
                    GraphNode(
                        index=len(self.nodes),
                        name=prefix + op.name,
                        operation=op,
                        node=node,
                        arg_keys=arg_keys,
                        out_keys=out_keys,
                        out_shapes=[tuple(t.shape) for t in node.outputs],
                    )
                )

    def Inline(self, model: Any, node: Any, arg_keys: list, out_keys: list, prefix: str) -> None:
        """The nested model's nodes, its inputs aliased to the outer arguments and its
        outputs to the outer node's outputs (so later nodes find them)."""
        inner = _Functional(model, prefix + model.name)
        count = self.calls.get(id(model), 0)
        self.calls[id(model)] = count + 1
        scope = f"{prefix}{model.name}@{count}/"
        if len(inner.inputs) != len(arg_keys):
            raise ValueError(
                f"{prefix}{model.name}: nested model called with {len(arg_keys)} tensor(s), "
                f"expected its {len(inner.inputs)} input(s); pass them as one list or dict"
            )
        for t, key in zip(inner.inputs, arg_keys):
            self.alias[(scope, id(t))] = key
        name_prefix = prefix + model.name + ("/" if count == 0 else f"@{count}/")
        self.Walk(inner, scope, name_prefix)
        for t, key in zip(inner.outputs, out_keys):
            inner_key = self.Key(scope, t)
            if inner_key != key:
                self.alias[key] = inner_key  # later nodes read the inner tensor


def Trace(model: Any, where: str = "lingpipe.keras.Pipeline") -> Graph:
    """The nodes of `model` (built Functional or keras.Sequential), nested models inlined."""
    functional = _Functional(model, where)
    tracer = _Tracer()
    input_keys = [tracer.Key("", t) for t in functional.inputs]
    tracer.Walk(functional, "", "")
    output_keys = [tracer.Key("", t) for t in functional.outputs]
    for n in tracer.nodes:  # outer tensors named before their nested producer was inlined
        n.arg_keys = [_Follow(tracer.alias, k) for k in n.arg_keys]
        n.out_keys = [_Follow(tracer.alias, k) for k in n.out_keys]
    if not tracer.nodes:
        raise ValueError(f"{where}: model {model.name!r} has no layers to pipeline")
    return Graph(model, tracer.nodes, input_keys, output_keys, tracer.shapes, tracer.dtypes)


def _Follow(alias: dict, key: Any) -> Any:
    while key in alias:
        key = alias[key]
    return key


# ---- Costs -----------------------------------------------------------------------


def NodeParams(node: GraphNode) -> int:
    """Weights of the node's layer (0 for keras.ops operations)."""
    return int(node.operation.count_params()) if node.is_layer and node.operation.built else 0


def _LookupParams(layer: Any) -> int:
    """Weights of the Embedding layers in `layer` (itself, or nested in a layer of its
    own, as keras.io's TokenAndPositionEmbedding and keras_hub's embeddings nest them)."""
    if isinstance(layer, keras.layers.Embedding):
        return int(layer.count_params()) if layer.built else 0
    flatten = getattr(layer, "_flatten_layers", None)  # Keras 3's walk of nested layers
    if flatten is None:
        return 0
    return sum(
        int(sub.count_params())
        for sub in flatten(include_self=False, recursive=True)
        if isinstance(sub, keras.layers.Embedding) and sub.built
    )


def NodeFlops(node: GraphNode) -> int:
    """Per example: 2 x rows x weights + output elements (rows: output elements / last
    dim; exact for Dense and convolutions), as KerasCell.FPropMeta estimates. An
    Embedding is a lookup, not a matmul: it reads one row per output row, so its
    weights (also where a layer of the user's own holds it) add no FLOPs."""
    flops = 0
    weights = NodeParams(node) - (_LookupParams(node.operation) if node.is_layer else 0)
    for shape in node.out_shapes:
        dims = [1 if d is None else int(d) for d in shape[1:]] or [1]
        elements = int(np.prod(dims, dtype=np.int64))
        flops += 2 * (elements // max(dims[-1], 1)) * weights + elements
    return flops


def CallNode(node: GraphNode, values: dict, training: bool) -> None:
    """Calls the node's operation on `values` (key -> tensor) of its arguments, as Keras'
    Functional does; records its outputs in `values`."""
    tensors = {id(kt): values[k] for kt, k in zip(node.node.arguments.keras_tensors, node.arg_keys)}
    args, kwargs = node.node.arguments.fill_in(tensors)
    outputs = keras_functional.operation_fn(node.operation, training=training)(*args, **kwargs)
    for key, y in zip(node.out_keys, keras.tree.flatten(outputs)):
        values[key] = y


def SampleInput(shape: tuple, dtype: str, batch: int = 1) -> tf.Tensor:
    """A tensor of `shape` (batch dim and unknown dims: `batch` and 1): stateless normal
    floats, zeros otherwise (token ids)."""
    dims = [batch] + [1 if d is None else int(d) for d in shape[1:]]
    if tf.as_dtype(dtype).is_floating:
        return tf.random.stateless_normal(dims, [0, 1], dtype=dtype)
    return tf.zeros(dims, dtype)


def NodeCall(node: GraphNode, training: bool = True) -> Callable[..., tuple]:
    """fn(*values of node.arg_keys) -> the node's outputs (in out_keys' order), run under
    a keras.StatelessScope: whatever the call assigns (batch norm's statistics, a
    dropout's seed state) is dropped, so timing or tracing a node changes nothing."""

    def Call(*args: Any) -> tuple:
        values = dict(zip(node.arg_keys, args))
        with keras.StatelessScope(initialize_variables=False, collect_losses=False):
            CallNode(node, values, training)
        return tuple(values[k] for k in node.out_keys)

    return Call


def ExampleSpecs(graph: Graph, node: GraphNode) -> list[tf.TensorSpec]:
    """The node's arguments for one example (unknown dims 1)."""
    return [
        tf.TensorSpec([1, *[1 if d is None else d for d in graph.shapes[k][1:]]], graph.dtypes[k])
        for k in node.arg_keys
    ]


def CallKey(node: GraphNode, specs: list) -> Any:
    """What decides what a node computes: its operation's class and config (Keras 3
    records a layer's constructor arguments in it), and how it is called (its arguments,
    tensors as their specs). Equal keys trace and time alike; None when the config
    cannot be read (each call on its own)."""
    try:
        config = node.operation.get_config()
        config.pop("name", None)
        tensors = iter(specs)
        call = keras.tree.map_structure(
            lambda x: next(tensors) if isinstance(x, keras.KerasTensor) else x,
            (node.node.arguments.args, node.node.arguments.kwargs),
        )
        return (type(node.operation), repr(config), repr(call))
    except Exception:  # noqa: BLE001 (an operation without a config: no sharing)
        return None


def TrainableVariables(node: GraphNode) -> list:
    """The tf.Variables of the node's layer's trainable weights (none for keras.ops)."""
    return [w.value for w in node.operation.trainable_weights] if node.is_layer else []


def ProfileNodes(graph: Graph, repeats: int = 3) -> list[costs.UnitTimes]:
    """Each node's forward and backward seconds on one example (costs.TimeUnit, in
    training mode, state changes dropped: NodeCall), run where the model's weights are
    now; each node is fed its arguments' values from the nodes before it."""
    values = {k: SampleInput(graph.shapes[k], graph.dtypes[k]) for k in graph.input_keys}
    times = []
    for node in graph.nodes:
        args = tuple(values[k] for k in node.arg_keys)
        t, outputs = costs.TimeUnit(NodeCall(node), args, TrainableVariables(node), repeats)
        times.append(t)
        values.update(zip(node.out_keys, outputs))
    return times


def FirstUseParams(graph: Graph) -> list[int]:
    """Per node, its layer's weights where the layer is first called, 0 at its later
    calls (a shared layer's weights live once)."""
    seen: set = set()
    out = []
    for n in graph.nodes:
        out.append(NodeParams(n) if id(n.operation) not in seen else 0)
        seen.add(id(n.operation))
    return out


def NodeCosts(graph: Graph, policy: str) -> list[float]:
    """Each node's cost under a partition policy (costs.PolicyCosts): FLOPs per example,
    weights where first used, or measured forward + backward seconds (ProfileNodes)."""
    return costs.PolicyCosts(
        policy,
        len(graph.nodes),
        flops=lambda: [NodeFlops(n) for n in graph.nodes],
        params=lambda: FirstUseParams(graph),
        profile=lambda: ProfileNodes(graph),
    )


# ---- Cutting ---------------------------------------------------------------------


@dataclasses.dataclass
class Cut:
    """The graph cut into stages.

    Attributes:
      graph: the traced graph.
      stages: node indices of each stage (contiguous, in order).
      live: live[s] = keys of the tensors stage s receives (stage 0: the model's
        inputs); live[K] = the model's outputs, which the last stage returns.
      policy: how the cut was chosen.
      costs: each node's cost under the policy.
    """

    graph: Graph
    stages: list[list[int]]
    live: list[list]
    policy: str
    costs: list[float]

    def StageOf(self, node_index: int) -> int:
        for s, idx in enumerate(self.stages):
            if node_index in idx:
                return s
        raise IndexError(node_index)

    def LayerStages(self) -> dict:
        """id(layer) -> the stage of its first node (where its weights live)."""
        out: dict = {}
        for s, idx in enumerate(self.stages):
            for i in idx:
                out.setdefault(id(self.graph.nodes[i].operation), s)
        return out


def _SplitCounts(
    graph: Graph, split_points: Sequence[str], num_stages: int, where: str, label: str | None
) -> list:
    names = graph.LayerNames()
    if len(split_points) != num_stages - 1:
        count = f"num_stages - 1 = {num_stages - 1} split point(s)"
        if label:
            count = f"{num_stages - 1} split point(s) ({label})"
        raise ValueError(
            f"{where}: expected {count} (layer names where a stage begins), received "
            f"{len(split_points)}: {list(split_points)}"
        )
    starts = []
    for point in split_points:
        matches = [i for i, n in enumerate(names) if n == point or n.split("/")[-1] == point]
        if not matches:
            raise ValueError(
                f"{where}: unknown split point {point!r}; expected the name of a layer of the "
                f"model (nested ones as 'outer/inner'), e.g. {names[len(names) // 2]!r}"
            )
        starts.append(matches[0])
    if starts != sorted(set(starts)) or (starts and starts[0] == 0):
        raise ValueError(
            f"{where}: split points {list(split_points)} begin stages at nodes {starts}; "
            "expected layer names in graph order, after the first layer, each once"
        )
    bounds = [0, *starts, len(names)]
    return [b - a for a, b in zip(bounds, bounds[1:])]


def MakeCut(
    graph: Graph,
    num_stages: int,
    partition: Any = "flops",
    split_points: Sequence[str] | None = None,
    where: str = "lingpipe.keras.Pipeline",
    label: str | None = None,
) -> Cut:
    """Cuts `graph` into `num_stages` stages (by `partition`, or at `split_points`).

    `label` says where num_stages comes from in errors when it is not the user's
    num_stages (a schedule of several stages per device), e.g. "num_stages=2 x 2 stages
    per device of schedule 'zbv' = 4 stages".
    """
    n = len(graph.nodes)
    if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
        raise ValueError(f"{where}: expected num_stages >= 1, received num_stages={num_stages!r}")
    if num_stages > n:
        bound = f"at most {n} stages" if label else f"num_stages <= {n}"
        raise ValueError(
            f"{where}: {label or f'num_stages={num_stages}'} is more than the model's {n} "
            f"layer call(s); expected {bound}"
        )
    if split_points is not None:
        policy, unit_costs = "split_points", NodeCosts(graph, "flops")
        counts = _SplitCounts(graph, list(split_points), num_stages, where, label)
    else:
        if isinstance(partition, str) and partition not in POLICIES:
            raise ValueError(
                f"{where}: unknown partition={partition!r}; expected one of {POLICIES}, a list "
                "of node counts per stage, or split_points"
            )
        policy = partition if isinstance(partition, str) else f"explicit {list(partition)}"
        unit_costs = NodeCosts(graph, partition if isinstance(partition, str) else "flops")
        try:
            units = ("layer calls", "the model")
            counts = partition_lib.Counts(partition, unit_costs, num_stages, units)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    stages, start = [], 0
    for c in counts:
        stages.append(list(range(start, start + c)))
        start += c
    return Cut(graph, stages, LiveTensors(graph, stages), policy, unit_costs)


def _Lifetimes(graph: Graph) -> tuple[dict, dict]:
    """({key: index of the node producing it, -1 for a model input}, {key: index of its
    last reader, len(nodes) for a model output})."""
    produced_at = {k: -1 for k in graph.input_keys}
    for n in graph.nodes:
        for k in n.out_keys:
            produced_at.setdefault(k, n.index)
    last_use: dict = {}
    for n in graph.nodes:
        for k in n.arg_keys:
            last_use[k] = max(last_use.get(k, -1), n.index)
    for k in graph.output_keys:
        last_use[k] = len(graph.nodes)
    return produced_at, last_use


def LiveTensors(graph: Graph, stages: list[list[int]]) -> list[list]:
    """live[s]: keys produced before stage s (or model inputs) and used by stage s or
    later (or model outputs), in a fixed order; live[K]: the model's outputs."""
    produced_at, last_use = _Lifetimes(graph)
    live = [list(graph.input_keys)]  # the first stage receives every model input
    for idx in stages[1:]:
        first = idx[0]
        live.append(
            [k for k, at in produced_at.items() if at < first and last_use.get(k, -1) >= first]
        )
    live.append(list(dict.fromkeys(graph.output_keys)))
    return live


def TensorBytes(graph: Graph, key: Any) -> int:
    """Bytes of one example of the tensor `key` (unknown dims count as 1)."""
    dims = [1 if d is None else int(d) for d in graph.shapes[key][1:]]
    return int(np.prod(dims, dtype=np.int64)) * tf.as_dtype(graph.dtypes[key]).size


def CutBytes(graph: Graph) -> list[int]:
    """Per node i, the bytes per example of the tensors a cut after it sends on (those
    alive across it, as LiveTensors finds them); after the last node, the outputs'."""
    produced_at, last_use = _Lifetimes(graph)
    out = []
    for b in range(1, len(graph.nodes) + 1):
        keys = [k for k, at in produced_at.items() if at < b and last_use.get(k, -1) >= b]
        out.append(sum(TensorBytes(graph, k) for k in keys))
    return out


def TensorName(graph: Graph, key: Any) -> str:
    """'input:x', a node's name, or 'name[i]' for its i-th of several outputs."""
    if key in graph.input_keys:
        return f"input:{graph.model.inputs[graph.input_keys.index(key)].name}"
    for n in graph.nodes:
        if key in n.out_keys:
            i = n.out_keys.index(key)
            return n.name if len(n.out_keys) == 1 else f"{n.name}[{i}]"
    return str(key)
