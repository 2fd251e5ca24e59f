"""inspect_model: the layer tree read back against the layers, pipeline reports, totals."""

import re

import pytest

from lingpipe import model_registry
from lingpipe.layers import feedforward, normalization, sequential
from lingpipe.runners import inspect_model


@pytest.fixture(scope="module")
def task():
    """TransformerLmTiny: 4 cells in 2 stages, on CPU:0 and CPU:1."""
    return model_registry.GetParams("lm.TransformerLmTiny", "Train").Instantiate()


def Size(v):
    return int(v.shape.num_elements())


def ParseTree(text):
    """{key path: (what, count, device)} from LayerTree's text; keys as in layer.vars.

    A row's depth is its indentation; names are split from the other columns by
    two or more spaces.
    """
    rows, stack = {}, []
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        assert indent % 2 == 0, line
        depth = indent // 2
        assert depth <= len(stack), f"indented too deep: {line!r}"
        cols = re.split(r"\s{2,}", line.strip())
        label = cols[0].split(" (")[0]  # `fc[1] (relu)`: the key is fc[1]
        del stack[depth:]
        stack.append(label)
        key = ".".join(stack[1:]).replace(".[", "[")
        count = int(cols[2].replace(",", ""))
        rows[key] = (cols[1], count, " ".join(cols[3:]))
    return rows


def test_tree_lists_every_variable_with_shape_size_and_device(task):
    rows = ParseTree(inspect_model.LayerTree(task))
    variables = dict(task.vars.FlattenItems())
    assert len(variables) == 37
    var_rows = {k: r for k, r in rows.items() if r[2].startswith("@")}
    assert sorted(var_rows) == sorted(variables)
    for key, v in variables.items():
        shape = "[" + ",".join(str(d) for d in v.shape) + "]"
        device = "@CPU:" + v.device.rsplit(":", 1)[-1]
        assert var_rows[key] == (shape, Size(v), device), key
    assert rows["pipeline.cell_0.emb.emb"] == ("[259,64]", 259 * 64, "@CPU:0")
    assert rows["pipeline.cell_3.softmax.weight"] == ("[64,259]", 64 * 259, "@CPU:1")


def test_tree_counts_are_subtree_sums(task):
    text = inspect_model.LayerTree(task)
    rows = ParseTree(text)
    layer_rows = {k: r for k, r in rows.items() if not r[2]}

    def Visit(layer, key):
        want = sum(Size(v) for v in layer.vars.Flatten())
        assert layer_rows[key] == (type(layer).__name__, want, ""), key
        for name, child in layer.children.items():
            Visit(child, f"{key}.{name}" if key else name)

    Visit(task, "")
    assert layer_rows[""] == ("TransformerLm", 133_507, "")
    assert layer_rows["pipeline.cell_0.dropout"] == ("DropoutLayer", 0, "")
    # Nesting: the root is flush left, each level two spaces further in.
    lines = text.splitlines()
    assert lines[0].startswith("lm ")
    assert lines[1].startswith("  pipeline ")
    assert lines[2].startswith("    cell_0 ")
    assert lines[3].startswith("      emb ")
    assert lines[4].startswith("        emb ")


def test_pipeline_reports(task):
    reports = inspect_model.PipelineReports(task)
    adam = task.params.train.optimizer
    assert reports == [("lm/pipeline", str(task.pipeline.PartitionReport(optimizer=adam)))]
    stage_rows = [re.split(r"\s{2,}", line) for line in reports[0][1].splitlines()[1:3]]
    assert [r[:2] for r in stage_rows] == [["0", "/device:CPU:0"], ["1", "/device:CPU:1"]]
    # Stage parameters are those of the cells on the stage's device.
    by_device = {"/device:CPU:0": 0, "/device:CPU:1": 0}
    for v in task.vars.Flatten():
        by_device["/device:CPU:" + v.device.rsplit(":", 1)[-1]] += Size(v)
    assert {r[1]: int(r[3].replace(",", "")) for r in stage_rows} == by_device


def test_pipeline_reports_memory_under_the_tasks_optimizer(task):
    """The LM trains with Adam: per stage, gradients as big as the weights (all are
    trainable), two slots each, activations for its 2 micro-batches, and its update."""
    text = inspect_model.PipelineReports(task)[0][1]
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("memory per stage"))
    assert "schedule=gpipe K=2 M=2 remat=always, optimizer Adam" in lines[at]
    report = task.pipeline.PartitionReport(optimizer=task.params.train.optimizer)
    for s, line in zip(report.stages, lines[at + 2 : at + 4]):
        m = s.memory
        assert m.weights == m.gradients == 4 * s.num_params
        assert m.optimizer_slots == 2 * m.gradients and m.peak_alive == 2
        assert m.activations > 0 and line.split()[7] == f"{m.total / 2**20:.1f}"
        assert m.update > 0 and line.split()[6] == f"{m.update / 2**20:.1f}"
    assert lines[-1] == f"estimated total {report.memory_total / 2**20:.1f} MiB"


def test_describe(task):
    text = inspect_model.Describe(task)
    tree, pipeline, total = text.split("\n\n")
    assert tree == inspect_model.LayerTree(task)
    report = str(task.pipeline.PartitionReport(optimizer=task.params.train.optimizer))
    assert pipeline == "Pipeline lm/pipeline:\n" + "\n".join(
        "  " + line for line in report.splitlines()
    )
    num_params = sum(Size(v) for v in task.vars.Flatten())
    assert total == f"Total: {num_params:,} parameters ({num_params:,} trainable) in 37 variables"
    assert num_params == 133_507


def test_plain_layer_lists_and_non_trainable_variables():
    ffn = feedforward.FeedForwardNet.Params().Set(input_dims=3, hidden_layer_dims=[4, 2])
    bn = normalization.BatchNormLayer.Params().Set(name="bn", dim=2)
    net = (
        sequential.SequentialLayer.Params()
        .Set(name="net", sub=[ffn.Set(name="sub_0"), bn])
        .Instantiate()
    )
    assert inspect_model.PipelineReports(net) == []
    text = inspect_model.Describe(net)
    assert "Pipeline" not in text
    rows = ParseTree(inspect_model.LayerTree(net))
    variables = dict(net.vars.FlattenItems())
    assert sorted(k for k, r in rows.items() if r[2].startswith("@")) == sorted(variables)
    # List members are numbered, with their own name when it is not the default.
    lines = text.splitlines()
    assert re.match(r"  sub\[0\]\s+FeedForwardNet\s+26$", lines[1])
    assert re.match(r"    fc\[0\]\s+ProjectionLayer\s+16$", lines[2])
    assert re.match(r"  sub\[1\] \(bn\)\s+BatchNormLayer\s+8$", lines[8])
    assert rows["sub[0].fc[1].w"] == ("[4,2]", 8, "@CPU:0")
    moving = [k for k, r in rows.items() if r[2] == "@CPU:0 (not trainable)"]
    non_trainable = [k for k, v in variables.items() if not v.trainable]
    assert sorted(moving) == sorted(non_trainable) and len(moving) == 2
    assert lines[-1] == "Total: 34 parameters (30 trainable) in 8 variables"
