"""What a built model is: its layer tree, where its variables live, how it is pipelined.

    print(inspect_model.Describe(task))

    lm                        TransformerLm         133,507
      pipeline                PipeliningLayer       133,507
        cell_0                LmEmbeddingCell        16,576
          emb                 EmbeddingLayer         16,576
            emb               [259,64]               16,576  @CPU:0
          dropout             DropoutLayer                0
    ...
    Pipeline lm/pipeline:
      stage  device         cells   ...
    ...
    Total: 133,507 parameters (133,507 trainable) in 37 variables

One line per layer, indented by depth: its name in its parent's theta (a list's
members are `name[i]`, followed by the layer's own name when that is not
`name_i`), its class and the parameters of its subtree; under it, one line per
variable of its own: shape, size, device, and "(not trainable)" if so. The keys
read down the tree are the keys of `layer.vars` (`pipeline.cell_0.emb.emb`).
Parameters count every variable of the layer tree, trainable or not, as
PartitionReport counts them; variables that are not the layers' own (an
optimizer's slots) are not counted. Each pipeline's report ends with its memory
per stage in a training step (weights, gradients, the task's optimizer slots,
activations under its schedule and remat: lingpipe.pipeline.observe.memory).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from lingpipe import base_layer, cluster
from lingpipe.layers import gpipe

__all__ = [
    "Describe",
    "LayerTree",
    "PipelineReports",
    "TaskOptimizer",
]


def _OwnVariables(layer: base_layer.BaseLayer) -> list[tuple[str, tf.Variable]]:
    # `layer.vars` holds the children's vars too, under the children's names.
    return [(k, v) for k, v in layer.vars.items() if k not in layer.children]


def _Children(layer: base_layer.BaseLayer) -> list[tuple[str, base_layer.BaseLayer]]:
    """(label, child) in creation order; a list's members are labelled `name[i]`."""
    out = []
    for key, child in layer.children.items():
        if not isinstance(child, list):
            out.append((key, child))
            continue
        for i, c in enumerate(child):
            label = f"{key}[{i}]"
            if c.params.name != f"{key}_{i}":
                label += f" ({c.params.name})"
            out.append((label, c))
    return out


def _TreeVariables(layer: base_layer.BaseLayer) -> list[tf.Variable]:
    return tf.nest.flatten(layer.vars)


def _Size(v: tf.Variable) -> int:
    return int(v.shape.num_elements() or 0)


def _Device(v: tf.Variable) -> str:
    """'CPU:1' of '/job:localhost/replica:0/task:0/device:CPU:1'; 'worker 1/CPU:0' of a
    variable on another host ('/job:worker/replica:0/task:1/device:CPU:0')."""
    spec = tf.DeviceSpec.from_string(v.device or "")
    if spec.device_type is None:
        return "?"
    name = (
        spec.device_type if spec.device_index is None else f"{spec.device_type}:{spec.device_index}"
    )
    host = cluster.HostOf(v.device)
    return name if host == "local" else f"{host}/{name}"


def _Rows(layer: base_layer.BaseLayer, label: str, depth: int, rows: list) -> int:
    """Appends the rows of `layer`'s subtree; returns its parameter count."""
    at = len(rows)
    rows.append(None)  # this layer's row, once its count is known
    total = 0
    for name, v in _OwnVariables(layer):
        shape = "[" + ",".join(str(d) for d in v.shape.as_list()) + "]"
        where = f"@{_Device(v)}" + ("" if v.trainable else "  (not trainable)")
        rows.append(("  " * (depth + 1) + name, shape, _Size(v), where))
        total += _Size(v)
    for child_label, child in _Children(layer):
        total += _Rows(child, child_label, depth + 1, rows)
    rows[at] = ("  " * depth + label, type(layer).__name__, total, "")
    return total


def LayerTree(layer: base_layer.BaseLayer) -> str:
    """The layer tree of `layer`, one line per layer and per variable (module doc)."""
    rows: list = []
    _Rows(layer, layer.params.name, 0, rows)
    widths = [max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)]
    count_width = max(len(f"{r[2]:,}") for r in rows)
    lines = [
        f"{name.ljust(widths[0])}  {what.ljust(widths[1])}  {count:>{count_width},}  {device}"
        for name, what, count, device in rows
    ]
    return "\n".join(line.rstrip() for line in lines)


def _Walk(layer: base_layer.BaseLayer):
    yield layer
    for _, child in _Children(layer):
        yield from _Walk(child)


def TaskOptimizer(layer: base_layer.BaseLayer) -> Any:
    """The params of the optimizer that trains `layer` (a task's p.train.optimizer), or
    None for a layer that is not a task."""
    p = layer.params
    if "train" in p and p.train is not None and "optimizer" in p.train:
        return p.train.optimizer
    return None


def PipelineReports(layer: base_layer.BaseLayer) -> list[tuple[str, str]]:
    """(path, str(PartitionReport(optimizer=...))) of every PipeliningLayer in the tree,
    in tree order, with the memory of a training step under the task's optimizer.

    FLOPs, boundary sizes and memory show as '?' (or not at all) until the pipeline
    has input shapes (p.input_shapes, or a first FProp).
    """
    optimizer = TaskOptimizer(layer)
    return [
        (node.path, str(node.PartitionReport(optimizer=optimizer)))
        for node in _Walk(layer)
        if isinstance(node, gpipe.PipeliningLayer)
    ]


def Describe(layer: base_layer.BaseLayer) -> str:
    """The layer tree, each pipeline's partition report, and the totals."""
    parts = [LayerTree(layer)]
    for path, report in PipelineReports(layer):
        indented = "\n".join("  " + line for line in report.splitlines())
        parts.append(f"Pipeline {path}:\n{indented}")
    variables = _TreeVariables(layer)
    num_params = sum(_Size(v) for v in variables)
    trainable = sum(_Size(v) for v in variables if v.trainable)
    parts.append(
        f"Total: {num_params:,} parameters ({trainable:,} trainable) in {len(variables)} variables"
    )
    return "\n\n".join(parts)
