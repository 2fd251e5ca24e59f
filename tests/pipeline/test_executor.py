"""ForwardBackward follows a schedule: equal to the sequential reference, in the
schedule's order (read from the traced graph), on each stage's device, concurrent."""

import collections
import itertools
import re
import threading

import numpy as np
import pytest
import tensorflow as tf
from gpipe_cells import (
    DIMS,
    BarrierCell,
    Mlp,
    MlpWithBatchNorm,
    MlpWithDropout,
    Pipeline,
    SkipCell,
    Transformer,
)
from pipeline_reference import AssertSameAsReference, Loss
from schedule_cases import ALL

from lingpipe import base_layer, seeds, test_utils
from lingpipe.nested_map import NestedMap
from lingpipe.pipeline.schedules import generators, schedule

REMATS = ("always", "except_last", "never")
FOUR = generators.SCHEDULES[:4]  # gpipe, 1f1b, interleaved_1f1b, zero_bubble
CASES = [c for c in ALL if c[0] in FOUR]  # every K, M and v that can run (test_schedule)
# The other schedules (V placement among them), the remat policy rotating. For each
# schedule and v, two (K, M) diagonals meet every K and every M twice, M below K and
# above it; the rest of every K, M and v that can run is a further proof (extended).
_DIAGONALS = {
    (k, m)
    for a, k in enumerate((1, 2, 3, 4))
    for b, m in enumerate((1, 2, 4, 8))
    if (b - a) % 4 in (0, 2)
}
OTHERS = [
    pytest.param(
        name, k, m, v, REMATS[(k + i) % 3],
        marks=[] if (k, m) in _DIAGONALS or name == "dualpipev" else [pytest.mark.extended],
    )
    for i, (name, k, m, v) in enumerate(c for c in ALL if c[0] not in FOUR)
]  # fmt: skip
# Two orthogonal Latin squares over GF(4) (a + b and a + 2b) on K (rows) and M
# (columns) pick the schedule and the remat policy (its fourth level is 'always'
# again): 16 cases in which every pair of values of any two of K, M, schedule and
# remat meets.
_GF4_TIMES_2 = (0, 2, 3, 1)


def _EveryPair(v_of):
    """(name, k, m, v, remat) cases over every pair of values; v_of(name, k, m) gives v."""
    return [
        (name, k, m, v_of(name, k, m), (*REMATS, "always")[a ^ _GF4_TIMES_2[b]])
        for a, k in enumerate((1, 2, 3, 4))
        for b, m in enumerate((1, 2, 4, 8))
        for name in [FOUR[a ^ b]]
    ]


# Traced (the graph, with its chains and held-back weight gradients): the eager grid
# below runs every K, M and v of the four schedules through the same executor; traced,
# each schedule meets every K, every M and every remat policy, and each (K, M) pair
# is traced once. Interleaved runs v=2, and v=1 too.
TRACED = _EveryPair(lambda name, k, m: 2 if name == "interleaved_1f1b" else 1)
TRACED += [(*case[:3], 1, case[4]) for case in TRACED if case[3] == 2]

# A transformer stack (4 layers, so K * v <= 4) over every pair of values, eagerly.
# Interleaved runs v=2 where M allows it.
TRANSFORMER = _EveryPair(
    lambda name, k, m: 2 if name == "interleaved_1f1b" and k <= 2 and m % k == 0 else 1
)


@pytest.mark.parametrize("cases", ["TRACED", "TRANSFORMER"])
def test_the_traced_and_transformer_cases_cover_every_pair_of_values(cases):
    # factor: (its position in a case, its values)
    factors = {
        "schedule": (0, FOUR),
        "K": (1, (1, 2, 3, 4)),
        "M": (2, (1, 2, 4, 8)),
        "remat": (4, REMATS),
    }
    for x, y in itertools.combinations(factors, 2):
        (i, xs), (j, ys) = factors[x], factors[y]
        seen = {(case[i], case[j]) for case in globals()[cases]}
        assert seen == set(itertools.product(xs, ys)), (x, y)


# Eagerly: the four on the two (K, M) diagonals with each v, the remat policy rotating
# (each policy meets each schedule and K); the rest of every K, M and v is extended.
EAGER = [
    pytest.param(
        name, k, m, v, REMATS[(k + m + v) % 3],
        marks=[] if (k, m) in _DIAGONALS else [pytest.mark.extended],
    )
    for name, k, m, v in CASES
]  # fmt: skip


@pytest.mark.parametrize("name,k,m,v,remat", EAGER)
def test_mlp_grid_eagerly(name, k, m, v, remat):
    pipe = Pipeline([Mlp()] * 8, k, m, remat, schedule=name, num_virtual_stages=v)
    AssertSameAsReference(pipe, (tf.random.normal([8, DIMS]),))


def test_the_other_schedules_default_cases_meet_every_k_m_and_remat():
    default = [case.values for case in OTHERS if not case.marks]
    for name, v in {(case[0], case[3]) for case in default}:
        mine = [case for case in default if (case[0], case[3]) == (name, v)]
        ks, ms = {case[1] for case in mine}, {case[2] for case in mine}
        # DualPipeV takes M >= 2K only: every K, and every M it can run.
        assert ks == {1, 2, 3, 4}, (name, v)
        assert ms == ({2, 4, 8} if name == "dualpipev" else {1, 2, 4, 8}), (name, v)
        assert any(m < k for _, k, m, _, _ in mine) or name == "dualpipev", (name, v)
    for name in {case[0] for case in default}:
        assert {case[4] for case in default if case[0] == name} == set(REMATS), name


@pytest.mark.parametrize("name,k,m,v,remat", OTHERS)
def test_mlp_grid_of_the_other_schedules_eagerly(name, k, m, v, remat):
    pipe = Pipeline([Mlp()] * 8, k, m, remat, schedule=name, num_virtual_stages=v)
    assert len(pipe.stage_cells) == pipe.Schedule(m).num_stages
    AssertSameAsReference(pipe, (tf.random.normal([8, DIMS]),), rtol=1e-5)


def test_schedule_given_as_a_value_or_a_csv_file(tmp_path):
    sched = generators.Make("zbv", 2, 4)
    path = tmp_path / "zbv.csv"
    path.write_text(schedule.ToCsv(sched))
    for spec in (sched, str(path)):
        pipe = Pipeline([Mlp()] * 4, 2, 4, "except_last", schedule=spec)
        assert pipe.Schedule(4).stage_devices == (0, 1, 1, 0)
        assert [pipe.StageDevice(s)[-5:] for s in range(4)] == ["CPU:0", "CPU:1", "CPU:1", "CPU:0"]
        AssertSameAsReference(pipe, (tf.random.normal([8, DIMS]),), rtol=1e-5)


@pytest.mark.grappler
@pytest.mark.parametrize("name,k,m,v,remat", TRACED)
def test_mlp_grid_traced(name, k, m, v, remat):
    pipe = Pipeline([Mlp()] * 8, k, m, remat, schedule=name, num_virtual_stages=v)
    AssertSameAsReference(pipe, (tf.random.normal([8, DIMS]),), use_function=True)


@pytest.mark.parametrize("name,k,m,v,remat", TRANSFORMER)
def test_transformer_stack_eagerly(name, k, m, v, remat):
    pipe = Pipeline([Transformer()] * 4, k, m, remat, schedule=name, num_virtual_stages=v)
    paddings = tf.cast(tf.random.uniform([8, 5]) < 0.2, tf.float32)
    AssertSameAsReference(pipe, (tf.random.normal([8, 5, DIMS]), paddings))


@pytest.mark.parametrize("name", FOUR)
def test_dropout_batch_norm_and_an_uneven_batch(name):
    v = 2 if name == "interleaved_1f1b" else 1
    cells = [MlpWithBatchNorm(), MlpWithDropout(), Mlp(), MlpWithDropout()]
    pipe = Pipeline(cells, 2, 2, "except_last", schedule=name, num_virtual_stages=v)
    x = tf.random.normal([7, DIMS])
    with seeds.StepSeedScope(3):
        AssertSameAsReference(pipe, (x,), use_function=True)
    # The pipeline moved batch norm's moving averages once (the reference once more).
    moving_mean = pipe.cell_0.sub[1].vars.moving_mean.numpy()
    assert not np.allclose(moving_mean, 0.0)


@pytest.mark.parametrize("name", FOUR)
def test_nested_map_state_carries_a_skip_connection_across_stages(name):
    v = 2 if name == "interleaved_1f1b" else 1
    modes = ["save", "", "add", ""]
    cells = [SkipCell.Params().Set(mode=mode) for mode in modes]
    pipe = Pipeline(cells, 2, 4, "always", schedule=name, num_virtual_stages=v)
    x = tf.random.normal([8, DIMS])
    AssertSameAsReference(pipe, (NestedMap(x=x, skip=tf.zeros_like(x)),), use_function=True)


_ACTION = re.compile(r"(?:^|/)([FBIW])_s(\d+)_mb(\d+)/")


def _ActionOps(graph):
    ops = collections.defaultdict(list)
    for op in graph.get_operations():
        match = _ACTION.search(op.name)
        if match:
            ops[(match.group(1), int(match.group(2)), int(match.group(3)))].append(op)
    return ops


def _ChainPredecessors(graph, sched):
    """Per action: the actions of the same device its ops wait for by a control edge."""
    ops = _ActionOps(graph)
    owner = {op: key for key, group in ops.items() for op in group}
    preds = collections.defaultdict(set)
    for key, group in ops.items():
        for op in group:
            for dep in op.control_inputs:
                other = owner.get(dep)
                same_device = other and sched.DeviceOf(other[1]) == sched.DeviceOf(key[1])
                if other and other != key and same_device:
                    preds[key].add(other)
    return ops, preds


@pytest.mark.parametrize(
    "name,k,m,v", [("gpipe", 3, 4, 1), ("1f1b", 4, 8, 1), ("zero_bubble", 3, 4, 1),
                   ("interleaved_1f1b", 2, 4, 2), ("zbv", 2, 4, 1), ("dualpipev", 2, 4, 1),
                   ("v_half", 2, 4, 1), ("v_min", 3, 4, 1)],
)  # fmt: skip
def test_each_device_follows_its_list_in_the_traced_graph(name, k, m, v):
    pipe = Pipeline([Mlp()] * 8, k, m, "always", schedule=name, num_virtual_stages=v)
    x = tf.random.normal([8, DIMS])
    step = lambda: pipe.ForwardBackward(pipe.theta, (x,), Loss).metrics  # noqa: E731
    graph = tf.function(step, autograph=False).get_concrete_function().graph
    sched = pipe.Schedule(m)
    ops, preds = _ChainPredecessors(graph, sched)
    for acts in sched.device_actions:
        keys = [tuple(a) for a in acts]
        previous_w = {}
        for i, key in enumerate(keys):
            assert key in ops, f"{key} has no ops in the graph"
            expected = {keys[i - 1]} if i else set()
            if key[0] == "I":  # its weight-only ops wait for W's turn instead
                w = keys.index(("W",) + key[1:])
                if keys[w - 1] != key:
                    previous_w[key] = keys[w - 1]
                    expected.add(keys[w - 1])
            assert preds[key] == expected, (key, preds[key], expected)
        for key, gate in previous_w.items():
            # The held-back ops are the weight gradient's: MatMuls, and no Tanh replay.
            held = [op for op in ops[key] if any(owner_is(gate, d, ops) for d in op.control_inputs)]
            assert held and {op.type for op in held} <= {
                "MatMul",
                "Sum",
                "Mul",
                "BiasAddGrad",
                "Identity",
                "Reshape",
                "Const",
                "Transpose",
                "ShapeN",
                "Shape",
            }, held


@pytest.mark.parametrize("name", ["1f1b", "zero_bubble"])
def test_an_action_waits_on_one_op_of_the_previous_one_not_on_each_tensor(name):
    """Ops that read no tensor of their own action (weight reads, constants) carry the
    device's order: each needs one control edge, not one per tensor of the previous
    action (a stage's every gradient sum), or the graph grows as weights x weights."""
    pipe = Pipeline([Mlp()] * 8, 2, 4, "always", schedule=name)
    x = tf.random.normal([8, DIMS])
    step = lambda: pipe.ForwardBackward(pipe.theta, (x,), Loss).metrics  # noqa: E731
    graph = tf.function(step, autograph=False).get_concrete_function().graph
    ops = _ActionOps(graph)
    owner = {op: key for key, group in ops.items() for op in group}
    most = max(
        sum(1 for dep in op.control_inputs if owner.get(dep, key) != key)
        for key, group in ops.items()
        for op in group
    )
    # Zero bubble's held-back weight-gradient ops also wait on W's turn: one more.
    assert most == (2 if name == "zero_bubble" else 1), f"an op waits on {most} other actions' ops"


def owner_is(key, op, ops):
    return op in ops[key]


@pytest.mark.parametrize(
    "name,v", [("gpipe", 1), ("1f1b", 1), ("zero_bubble", 1), ("interleaved_1f1b", 2), ("zbv", 1)]
)
def test_every_op_of_every_action_is_on_its_stage_device(name, v):
    pipe = Pipeline([Mlp()] * 8, 4, 4, "always", schedule=name, num_virtual_stages=v)
    x = tf.random.normal([8, DIMS])
    step = lambda: pipe.ForwardBackward(pipe.theta, (x,), Loss).theta_grads  # noqa: E731
    graph = tf.function(step, autograph=False).get_concrete_function().graph
    ops = _ActionOps(graph)
    chunks = 8 if name == "zbv" else 4 * v
    assert len(ops) == chunks * 4 * (3 if name in ("zero_bubble", "zbv") else 2)
    for (_, stage, _), group in ops.items():
        want = pipe.StageDevice(stage)[-len("/device:CPU:0") :]
        # A variable's handle and reads run where the variable lives (checked below).
        wrong = [
            (op.name, op.device)
            for op in group
            if op.type not in ("Placeholder", "ReadVariableOp") and not op.device.endswith(want)
        ]
        assert not wrong, wrong[:5]
    for idx, device in zip(pipe.stage_cells, [pipe.StageDevice(s) for s in range(chunks)]):
        for i in idx:
            assert all(w.device.endswith(device[-5:]) for w in getattr(pipe, f"cell_{i}").variables)


@pytest.mark.grappler
def test_stages_overlap_under_1f1b():
    pipe_barrier = _BarrierPipelineFor("1f1b")
    pipe, x = pipe_barrier
    tf.function(lambda: pipe.ForwardBackward(pipe.theta, (x,), Loss).metrics, autograph=False)()
    assert sorted(BarrierCell.meetings) == [(0, 1), (1, 0)]


def _BarrierPipelineFor(name):
    BarrierCell.barrier = threading.Barrier(2, timeout=60)
    BarrierCell.meetings = []
    cells = [BarrierCell.Params().Set(stage=0), BarrierCell.Params().Set(stage=1), Mlp()]
    pipe = Pipeline(cells, 2, 2, "never", schedule=name, partition=[1, 2])
    x = tf.constant(np.repeat([[0.0], [1.0]], 2, axis=0) * np.ones([4, DIMS]), tf.float32)
    return pipe, x


def test_except_last_keeps_the_micro_batch_whose_backward_follows_its_forward():
    pipe = Pipeline([Mlp()] * 4, 2, 4, "except_last", schedule="gpipe")
    assert pipe.KeptActivations(pipe.Schedule(4)) == {(0, 3), (1, 3)}
    pipe = Pipeline([Mlp()] * 4, 2, 4, "except_last", schedule="1f1b")
    # Device 1 runs F B F B...: every gap is 1, the latest wins. Device 0 runs
    # F0 F1 B0 F2 B1 F3 B2 B3: only micro-batch 0 has no other backward (replaying its
    # forward, holding its activations) between its F and B; F3 has a closer B3 but
    # keeping it would hold two micro-batches' activations during B2.
    assert pipe.KeptActivations(pipe.Schedule(4)) == {(0, 0), (1, 3)}
    pipe = Pipeline([Mlp()] * 4, 2, 4, "except_last", schedule="zero_bubble")
    assert (1, 3) in pipe.KeptActivations(pipe.Schedule(4))


def test_errors_name_what_was_received():
    with pytest.raises(
        ValueError, match=r"unknown schedule 'zerobubble'.*did you mean 'zero_bubble'"
    ):
        Pipeline([Mlp()] * 4, 2, 4, schedule="zerobubble")
    with pytest.raises(
        ValueError, match=r"num_stages=2 x num_virtual_stages=3 = 6 chunks is greater"
    ):
        Pipeline([Mlp()] * 4, 2, 4, schedule="interleaved_1f1b", num_virtual_stages=3)
    with pytest.raises(ValueError, match=r"expected num_micro_batches >= 2 \* num_stages = 4"):
        Pipeline([Mlp()] * 4, 2, 3, schedule="dualpipev")
    pipe = Pipeline([Mlp()] * 4, 2, 2, schedule="1f1b")
    x = tf.random.normal([4, DIMS])
    with pytest.raises(
        ValueError,
        match=r"loss_fn must return a NestedMap of \(value, weight\) pairs with 'loss', "
        r"received EagerTensor",
    ):
        pipe.ForwardBackward(pipe.theta, (x,), lambda out, _: tf.reduce_sum(out))
    with pytest.raises(
        ValueError, match=r"each metric as a \(value, weight\) pair, received loss="
    ):
        pipe.ForwardBackward(pipe.theta, (x,), lambda out, _: NestedMap(loss=tf.reduce_sum(out)))


def test_fprop_under_a_callers_tape_still_runs_in_eval_and_training():
    pipe = Pipeline([Mlp()] * 4, 2, 4, "always", schedule="1f1b")
    x = tf.random.normal([8, DIMS])
    with base_layer.EvalMode():
        y = pipe.FProp(pipe.theta, x)
    test_utils.AssertAllCloseToScale(y, pipe.FPropSequential(pipe.theta, x))


def _Ancestors(op):
    seen, todo = set(), [op]
    while todo:
        o = todo.pop()
        for dep in [t.op for t in o.inputs] + list(o.control_inputs):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


@pytest.mark.parametrize("name,m", [("gpipe", 1), ("1f1b", 4), ("zero_bubble", 2)])
def test_a_replayed_forward_waits_for_the_gradient_it_serves(name, m):
    """Recomputed, stage 0's forward runs again in its backward only once stage 1's
    backward has sent the gradient: run as soon as device 0 is free (right after its
    forwards), it would hold the activations through stage 1's backward, as if kept."""
    pipe = Pipeline([Mlp()] * 4, 2, m, "always", schedule=name)
    x = tf.random.normal([8, DIMS])
    step = lambda: pipe.ForwardBackward(pipe.theta, (x,), Loss).metrics  # noqa: E731
    graph = tf.function(step, autograph=False).get_concrete_function().graph
    ops = _ActionOps(graph)
    first = "I" if name == "zero_bubble" else "B"
    for mb in range(m):
        replayed = [op for op in ops[(first, 0, mb)] if op.type == "Tanh"]
        assert replayed, f"stage 0's {first} of micro-batch {mb} replays no Tanh"
        served = set(ops[(first, 1, mb)])
        for op in replayed:
            assert _Ancestors(op) & served, f"{op.name} does not wait for stage 1's {first}"
