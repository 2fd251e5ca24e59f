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
"""

from __future__ import annotations

from collections.abc import Sequence

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


def Profile(graph: graph_lib.Graph, sizes: Sequence[int], repeats: int = 5) -> cost_model.CellTimes:
    """The nodes' times (module doc), run where the model's weights are now."""
    sizes = sorted(set(sizes))
    values = {
        n: {k: graph_lib.SampleInput(graph.shapes[k], graph.dtypes[k], n) for k in graph.input_keys}
        for n in sizes
    }
    last, timed = _LastUse(graph), {}  # timed: CallKey -> (F, I, W, B) per size
    measured = []
    for node in graph.nodes:
        call, weights = graph_lib.NodeCall(node), graph_lib.TrainableVariables(node)
        key = graph_lib.CallKey(node, graph_lib.ExampleSpecs(graph, node))
        per_size = []
        for n in sizes:
            args = tuple(values[n][k] for k in node.arg_keys)
            if key is not None and key in timed:
                seconds, outputs = timed[key][len(per_size)], call(*args)
            else:
                seconds, outputs = cell_times.UnitSeconds(call, weights, args, repeats)
            per_size.append(seconds)
            values[n].update(zip(node.out_keys, outputs))
            for k in node.arg_keys:
                if last[k] == node.index:
                    values[n].pop(k, None)  # one node's inputs in memory, not the model's
        if key is not None:
            timed.setdefault(key, per_size)
        measured.append(per_size)
    return cell_times.Lines(sizes, measured)
