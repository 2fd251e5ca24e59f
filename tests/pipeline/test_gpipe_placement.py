"""Placement, recomputation and concurrency, read from traced graphs and a barrier."""

import collections
import re
import threading

import numpy as np
import pytest
import tensorflow as tf
from gpipe_cells import (
    DIMS,
    STAGE_SCOPE,
    BarrierCell,
    Misplaced,
    Mlp,
    Pipeline,
    SquareLoss,
    Transformer,
)

from lingpipe import base_layer


def _Graph(pipe, args, how):
    def TapeStep():
        with tf.GradientTape() as tape:
            loss = SquareLoss(pipe.FProp(pipe.theta, *args))
        return tape.gradient(loss, pipe.trainable_variables)

    def GradientsStep():
        loss = SquareLoss(pipe.FProp(pipe.theta, *args))
        return tf.gradients(loss, pipe.trainable_variables)

    step = {"tape": TapeStep, "tf.gradients": GradientsStep}[how]
    return tf.function(step).get_concrete_function().graph


@pytest.mark.parametrize("how", ["tape", "tf.gradients"])
@pytest.mark.parametrize("remat", ["always", "never"])
def test_every_stage_op_forward_recompute_and_gradient_is_on_its_device(how, remat):
    pipe = Pipeline([Mlp()] * 8, 4, 4, remat)
    graph = _Graph(pipe, (tf.random.normal([8, DIMS]),), how)
    assert Misplaced(graph) == []
    kinds = collections.Counter()
    for op in graph.get_operations():
        m = STAGE_SCOPE.search(op.name)
        if m:
            kinds["grad" if "B_s" in m.group(0) else "fwd"] += 1
            assert op.type != "Einsum" or op.device == f"/device:CPU:{m.group(1)}"
    assert kinds["grad"] > 0 and kinds["fwd"] > 0
    # The cells' compute lives only inside stage scopes: outside are the loss and its
    # gradient, nothing of the cells (no Einsum, Tanh or TanhGrad).
    outside = {op.type for op in graph.get_operations() if not STAGE_SCOPE.search(op.name)}
    assert not outside & {"Einsum", "MatMul", "Tanh", "TanhGrad", "BiasAdd"}


def test_variables_of_each_stage_live_on_its_device():
    pipe = Pipeline([Mlp()] * 6, 3, 2, partition=[1, 2, 3])
    assert pipe.stage_cells == [[0], [1, 2], [3, 4, 5]]
    for k, cells in enumerate(pipe.stage_cells):
        for i in cells:
            for v in getattr(pipe, f"cell_{i}").variables:
                assert v.device.endswith(f"CPU:{k}"), (v.name, v.device)


def test_transformer_stack_placement_with_tape():
    pipe = Pipeline([Transformer(dropout_prob=0.1)] * 4, 2, 4, "always")
    args = (tf.random.normal([8, 5, DIMS]), tf.zeros([8, 5]))
    assert Misplaced(_Graph(pipe, args, "tape")) == []


def _ForwardOpsInBackward(graph, op_type):
    """Per (stage, micro-batch): how many `op_type` ops its backward scope holds."""
    counts = collections.Counter()
    for op in graph.get_operations():
        m = re.search(r"(?:^|/)B_s(\d+)_mb(\d+)/", op.name)
        if m and op.type == op_type:
            counts[(int(m.group(1)), int(m.group(2)))] += 1
    return counts


@pytest.mark.parametrize(
    "remat,recomputed",
    [
        ("always", {0, 1, 2, 3}),
        ("except_last", {0, 1, 2}),
        ("never", set()),
    ],
)
def test_recompute_really_recomputes(remat, recomputed):
    pipe = Pipeline([Mlp()] * 4, 2, 4, remat)
    graph = _Graph(pipe, (tf.random.normal([8, DIMS]),), "tape")
    tanh_in_backward = _ForwardOpsInBackward(graph, "Tanh")
    # Each stage has 2 cells, each with one tanh: a recomputed micro-batch replays both.
    for k in range(2):
        for m in range(4):
            assert tanh_in_backward[(k, m)] == (2 if m in recomputed else 0), (k, m)


@pytest.mark.parametrize(
    "remat,recomputed",
    [
        (["always", "except_last"], [{0, 1, 2, 3}, {0, 1, 2}]),
        (("never", "always"), [set(), {0, 1, 2, 3}]),
    ],
)
def test_recompute_follows_each_stage_s_policy(remat, recomputed):
    pipe = Pipeline([Mlp()] * 4, 2, 4, remat)
    graph = _Graph(pipe, (tf.random.normal([8, DIMS]),), "tape")
    tanh_in_backward = _ForwardOpsInBackward(graph, "Tanh")
    for k in range(2):
        for m in range(4):
            assert tanh_in_backward[(k, m)] == (2 if m in recomputed[k] else 0), (k, m)


def _BarrierPipeline(timeout):
    BarrierCell.barrier = threading.Barrier(2, timeout=timeout)
    BarrierCell.meetings = []
    cells = [BarrierCell.Params().Set(stage=0), BarrierCell.Params().Set(stage=1)]
    pipe = Pipeline(cells, 2, 2)
    x = tf.constant(np.repeat([[0.0], [1.0]], 2, axis=0) * np.ones([4, DIMS]), tf.float32)
    return pipe, x


@pytest.mark.grappler
def test_stages_work_on_different_micro_batches_at_the_same_time():
    pipe, x = _BarrierPipeline(timeout=60)
    for mode in (False, True):  # training (fill-drain) and eval (forward-only)
        with base_layer.EvalMode(mode):
            y = tf.function(lambda: pipe.FProp(pipe.theta, x))()
        np.testing.assert_array_equal(y.numpy(), x.numpy())
        assert sorted(BarrierCell.meetings) == [(0, 1), (1, 0)]
        BarrierCell.meetings = []


def test_the_barrier_catches_a_serialized_schedule():
    # Eagerly, ops run one at a time in program order: stage 0 on micro-batch 1 waits
    # for a partner that can only start after it. The barrier times out, so the test
    # above would fail for a schedule that serialized the stages.
    pipe, x = _BarrierPipeline(timeout=2)
    with pytest.raises(threading.BrokenBarrierError):
        pipe.FProp(pipe.theta, x)


@pytest.mark.parametrize("remat", ["always", "never"])
def test_eager_gradients_are_computed_on_their_stage_device(remat):
    pipe = Pipeline([Mlp()] * 6, 3, 4, remat)
    x = tf.random.normal([8, DIMS])
    with tf.GradientTape() as tape:
        y = pipe(x)
        loss = SquareLoss(y)
    grads = tape.gradient(loss, pipe.trainable_variables)
    assert y.device.endswith("CPU:2")  # merged on the last stage
    for v, g in zip(pipe.trainable_variables, grads):
        assert g.device.endswith(v.device[-5:]), (v.name, v.device, g.device)


@pytest.mark.parametrize("how", ["tape", "tf.gradients"])
def test_v_placement_puts_both_ends_of_the_model_on_the_first_device(how):
    """zbv over K=2 devices: 4 stages, stages 0 and 3 on device 0, 1 and 2 on device 1;
    FProp under a tape (fill-drain over that placement) places every op so."""
    pipe = Pipeline([Mlp()] * 8, 2, 4, "except_last", schedule="zbv")
    device_of = [0, 1, 1, 0]
    assert [pipe.StageDevice(s)[-5:] for s in range(4)] == [f"CPU:{d}" for d in device_of]
    for s, cells in enumerate(pipe.stage_cells):
        for i in cells:
            for v in getattr(pipe, f"cell_{i}").variables:
                assert v.device.endswith(f"CPU:{device_of[s]}"), (v.name, v.device)
    graph = _Graph(pipe, (tf.random.normal([8, DIMS]),), how)
    assert Misplaced(graph, lambda s: device_of[s]) == []
    names = " ".join(op.name for op in graph.get_operations())
    assert all(f"F_s{s}_mb3/" in names and f"B_s{s}_mb0/" in names for s in range(4))
