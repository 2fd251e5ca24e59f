"""Profiling each layer call of a Keras graph: its forward, inputs' gradient and weights'
gradient on this device, as lingpipe.pipeline.planning.cell_times profiles a
PipeliningLayer's cells.

    times = graph_times.Profile(graph, sizes=(8, 64))

Per micro-batch size n of `sizes`, every node (layer call) runs on sample inputs of n
rows (graph.SampleInput: normal floats, zero token ids), fed its arguments' values from
the nodes before it, in training mode with its state changes dropped (graph.NodeCall),
and is timed by cell_times.UnitSeconds: F, I, W and B as they run inside a step. Calls
alike (graph.CallKey: the same layer class, config, weights' shapes and arguments, as a
model's repeated blocks are) are timed once. Per kind and node a line
`fixed + per_example * n` through the sizes: the planner's costs.times.

With `partner` (a second device), each call also runs beside a copy of itself on that
device (cell_times.TogetherSeconds: B while another device computes, the planner's
backward_together, as for a PipeliningLayer's cells). The copy is the layer built
again from its config on `partner` with the same weights; a layer that cannot be built
so (no get_config) is costed I + W there, as without a partner. Calls with no weights
run as they are, placed on `partner`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import tensorflow as tf

from lingpipe.keras import graph as graph_lib
from lingpipe.pipeline.planning import cell_times, cost_model

__all__ = ["Profile"]


def _LastUse(graph: graph_lib.Graph) -> dict:
    """{tensor key: the index of the last node that reads it}."""
    last = {}
    for node in graph.nodes:
        for k in node.arg_keys:
            last[k] = node.index
    return last


def Profile(
    graph: graph_lib.Graph, sizes: Sequence[int], repeats: int = 5, partner: str | None = None
) -> cost_model.CellTimes:
    """The nodes' times (module doc), run where the model's weights are now; with
    `partner`, B together with a copy on that device too."""
    sizes = sorted(set(sizes))
    values = {
        n: {k: graph_lib.SampleInput(graph.shapes[k], graph.dtypes[k], n) for k in graph.input_keys}
        for n in sizes
    }
    # timed: CallKey -> ((F, I, W, B) per size, B together per size)
    last, timed = _LastUse(graph), {}
    measured, together = [], []
    for node in graph.nodes:
        call, weights = graph_lib.NodeCall(node), graph_lib.TrainableVariables(node)
        key = graph_lib.CallKey(node, graph_lib.ExampleSpecs(graph, node))
        twin = None
        per_size, both = [], []
        for n in sizes:
            args = tuple(values[n][k] for k in node.arg_keys)
            if key is not None and key in timed:
                i = len(per_size)
                seconds, outputs = timed[key][0][i], call(*args)
                pair = timed[key][1][i]
            else:
                seconds, outputs = cell_times.UnitSeconds(call, weights, args, repeats)
                pair = None
                if partner:
                    there = _There(args, partner)
                    twin = twin or _Twin(node, there, partner)
                    if twin is None:  # no copy: I + W, as without a partner
                        pair = seconds[1] + seconds[2]
                    else:
                        units = [(call, weights, args, None), (*twin, there, partner)]
                        pair = cell_times.TogetherSeconds(units, repeats)
            per_size.append(seconds)
            both.append(pair)
            values[n].update(zip(node.out_keys, outputs))
            for k in node.arg_keys:
                if last[k] == node.index:
                    values[n].pop(k, None)  # one node's inputs in memory, not the model's
        if key is not None:
            timed.setdefault(key, (per_size, both))
        measured.append(per_size)
        together.append(both)
    return cell_times.Lines(sizes, measured, together if partner else None)


def _There(args: tuple, device: str) -> tuple:
    with tf.device(device):
        return tuple(tf.identity(a) for a in args)


def _Twin(node: graph_lib.GraphNode, args: tuple, device: str) -> tuple[Callable, list] | None:
    """(call, trainable variables) of the node's copy on `device` (module doc): the same
    call where it has no weights; None where its layer cannot be built from its config."""
    op = node.operation
    if not node.is_layer or not op.weights:
        return graph_lib.NodeCall(node), []
    try:
        with tf.device(device):
            twin = dataclasses.replace(node, operation=type(op).from_config(op.get_config()))
            graph_lib.CallNode(twin, dict(zip(node.arg_keys, args)), True)  # builds it there
        twin.operation.set_weights(op.get_weights())
    except Exception:  # noqa: BLE001 (no config, or one that builds another layer: I + W)
        return None
    return graph_lib.NodeCall(twin), graph_lib.TrainableVariables(twin)
