"""Partition policies and the PartitionReport, checked against FPropMeta."""

import numpy as np
import pytest
import tensorflow as tf
from gpipe_cells import DIMS, Mlp, MlpWithBatchNorm, Pipeline, SquareLoss

from lingpipe.layers import feedforward
from lingpipe.pipeline.planning import costs, partition


def Heavy():
    return feedforward.FeedForwardNet.Params().Set(input_dims=DIMS, hidden_layer_dims=[512, DIMS])


UNEVEN = [Heavy(), Heavy()] + [Mlp()] * 6
SHAPES = [[16, DIMS]]


def _StageFlops(pipe):
    return [s.flops for s in pipe.PartitionReport(SHAPES).stages]


def test_flops_balances_uneven_cells_better_than_uniform():
    uniform = Pipeline(UNEVEN, 2, 2, partition="uniform", input_shapes=SHAPES)
    flops = Pipeline(UNEVEN, 2, 2, partition="flops", input_shapes=SHAPES)
    assert uniform.stage_cells == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert flops.stage_cells == [[0], [1, 2, 3, 4, 5, 6, 7]]
    assert max(_StageFlops(flops)) < max(_StageFlops(uniform))
    assert flops.PartitionReport().imbalance < 1.1


def test_params_policy_balances_parameters():
    pipe = Pipeline(UNEVEN, 2, 1, partition="params", input_shapes=SHAPES)
    assert pipe.stage_cells == [[0], [1, 2, 3, 4, 5, 6, 7]]


def test_profile_policy_cuts_by_measured_time():
    pipe = Pipeline(UNEVEN, 2, 2, partition="profile", input_shapes=SHAPES, profile_repeats=2)
    measured = pipe.cell_costs
    assert len(measured) == 8 and all(seconds > 0 for seconds in measured)
    # Which cells are slower depends on the machine; the cut is the optimum for them.
    counts = [len(c) for c in pipe.stage_cells]
    assert counts == partition.MinMaxPartition(measured, 2)
    assert [s.cost for s in pipe.PartitionReport().stages] == pytest.approx(
        [sum(measured[: counts[0]]), sum(measured[counts[0] :])]
    )


def test_report_numbers_match_fprop_meta():
    pipe = Pipeline(UNEVEN, 3, 4, partition="flops", input_shapes=SHAPES)
    metas = costs.CellMetas(pipe.params, UNEVEN, ([16, DIMS],))
    report = pipe.PartitionReport()
    for stage, cells in zip(report.stages, pipe.stage_cells):
        assert stage.flops == sum(metas[i].flops for i in cells)
        assert stage.num_params == sum(metas[i].num_params for i in cells)
        # The stage sends its last cell's output for one micro-batch: [16 / 4, 8] floats.
        assert stage.boundary_bytes == 4 * DIMS * 4
    assert report.imbalance == pytest.approx(
        max(s.cost for s in report.stages) / np.mean([s.cost for s in report.stages])
    )
    text = str(report)
    assert "/device:CPU:2" in text and "imbalance=" in text and "pipe/cell_0" in text


def test_report_counts_parameters_as_fprop_meta_does():
    cells = [MlpWithBatchNorm()] * 4  # batch norm: 2 trainable and 2 moving-average vectors
    pipe = Pipeline(cells, 2, 2, input_shapes=SHAPES)
    metas = costs.CellMetas(pipe.params, cells, ([16, DIMS],))
    for stage, idx in zip(pipe.PartitionReport().stages, pipe.stage_cells):
        assert stage.num_params == sum(metas[i].num_params for i in idx)


def test_report_without_shapes_then_after_a_call():
    pipe = Pipeline([Mlp()] * 4, 2, 2)
    assert pipe.PartitionReport().stages[0].flops is None
    assert "?" in str(pipe.PartitionReport())
    assert "micro_batches=2" in str(pipe.PartitionReport())  # the params' count
    pipe(tf.ones([6, DIMS]))
    assert pipe.PartitionReport().stages[0].flops > 0


def test_checkpoint_restores_across_partitions(tmp_path):
    four = Pipeline([Mlp()] * 4, 4, 2)
    x = tf.random.normal([4, DIMS])
    path = tf.train.Checkpoint(model=four).write(str(tmp_path / "ckpt"))
    two = Pipeline([Mlp()] * 4, 2, 2, random_seed=9)
    tf.train.Checkpoint(model=two).read(path).assert_consumed()
    np.testing.assert_allclose(two(x).numpy(), four(x).numpy(), rtol=1e-6)
    assert two.cell_3.vars.w.device.endswith("CPU:1")  # restored onto its own stage
    assert float(SquareLoss(two(x))) > 0
