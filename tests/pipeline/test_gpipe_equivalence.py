"""PipeliningLayer gives the outputs, loss and gradients of its sequential reference."""

import numpy as np
import pytest
import tensorflow as tf
from gpipe_cells import (
    DIMS,
    AssertSame,
    Misplaced,
    Mlp,
    MlpWithBatchNorm,
    MlpWithDropout,
    Pipeline,
    PipelineAndReference,
    PlainStack,
    SkipCell,
    SquareLoss,
    Transformer,
)
from pipeline_reference import AssertSameAsReference

from lingpipe import base_layer, seeds, test_utils
from lingpipe.nested_map import NestedMap

EXTENDED = pytest.mark.extended
REMATS = ("always", "except_last", "never")
GRID = [(k, m, remat) for k in (1, 2, 3, 4) for m in (1, 2, 4, 8) for remat in REMATS]
# Where every case costs a trace (the transformer's seconds, the MLP's traced grid):
# every (K, M) pair, with the remat policy rotating so that every (K, remat) and
# (M, remat) pair occurs too. The MLP runs the whole grid eagerly (the same ops
# without tracing's cost) and this one traced.
PAIRWISE_GRID = [
    (k, m, REMATS[(k + i) % 3]) for k in (1, 2, 3, 4) for i, m in enumerate((1, 2, 4, 8))
]
# Eagerly, the pairwise grid; the other K, M, remat combinations, and the pairwise grid
# traced (test_executor traces GPipe's among its schedules), are further proofs (extended).
MLP_GRID = [
    pytest.param(k, m, remat, False, marks=[] if (k, m, remat) in PAIRWISE_GRID else [EXTENDED])
    for k, m, remat in GRID
] + [pytest.param(k, m, remat, True, marks=[EXTENDED]) for k, m, remat in PAIRWISE_GRID]


def test_the_pairwise_grid_meets_every_pair_of_values():
    for i, j in ((0, 1), (0, 2), (1, 2)):
        assert {(c[i], c[j]) for c in PAIRWISE_GRID} == {(c[i], c[j]) for c in GRID}, (i, j)


@pytest.mark.parametrize("k,m,remat,traced", MLP_GRID)
def test_mlp_grid(k, m, remat, traced):
    pipe = Pipeline([Mlp()] * 8, k, m, remat)
    x = tf.random.normal([8, DIMS])
    got, want = PipelineAndReference(pipe, (x,), use_function=traced)
    AssertSame(got, want)
    # No batch coupling: the reference equals the plain stack on the whole batch.
    test_utils.AssertAllCloseToScale(got[0], PlainStack(pipe, x))


# One policy per stage (AdaPipe recomputes on the first stages only), V placement too.
PER_STAGE = [
    ("gpipe", 4, 4, ["always", "always", "never", "never"]),
    ("gpipe", 2, 2, ["except_last", "never"]),
    ("1f1b", 4, 8, ["never", "except_last", "always", "except_last"]),
    ("1f1b", 2, 4, ("always", "never")),
    ("zbv", 2, 4, ["always", "never", "except_last", "always"]),
]


@pytest.mark.parametrize("schedule,k,m,remat", PER_STAGE)
def test_mlp_per_stage_remat(schedule, k, m, remat):
    pipe = Pipeline([Mlp()] * 8, k, m, remat, schedule=schedule)
    x = tf.random.normal([8, DIMS])
    # Under a caller's tape (fill-drain over the schedule's placement)...
    got, want = PipelineAndReference(pipe, (x,))
    AssertSame(got, want)
    test_utils.AssertAllCloseToScale(got[0], PlainStack(pipe, x))
    # ... and in the schedule's own order.
    AssertSameAsReference(pipe, (x,), rtol=1e-5)


@pytest.mark.slow
@pytest.mark.extended  # test_executor's transformer cases (GPipe's among them) and k2_m4 stay
@pytest.mark.parametrize("k,m,remat", PAIRWISE_GRID)
def test_transformer_grid(k, m, remat):
    pipe = Pipeline([Transformer()] * 4, k, m, remat)
    x = tf.random.normal([8, 5, DIMS])
    paddings = tf.cast(tf.random.uniform([8, 5]) < 0.2, tf.float32)
    # Eagerly (the same ops, without tracing's cost); test_transformer_k2_m4 traces.
    got, want = PipelineAndReference(pipe, (x, paddings), use_function=False)
    AssertSame(got, want)
    test_utils.AssertAllCloseToScale(got[0], PlainStack(pipe, x, paddings))


@pytest.mark.parametrize("remat", ["always", "except_last", "never"])
def test_transformer_k2_m4(remat):
    pipe = Pipeline([Transformer()] * 4, 2, 4, remat)
    x = tf.random.normal([8, 5, DIMS])
    paddings = tf.zeros([8, 5])
    AssertSame(*PipelineAndReference(pipe, (x, paddings)))


@pytest.mark.parametrize("remat", ["always", "never"])
def test_uneven_batch_is_split_without_dropping_rows(remat):
    pipe = Pipeline([Mlp()] * 4, 2, 4, remat)
    x = tf.random.normal([10, DIMS])
    got, want = PipelineAndReference(pipe, (x,))
    AssertSame(got, want)
    assert got[0].shape == (10, DIMS)
    test_utils.AssertAllCloseToScale(got[0], PlainStack(pipe, x))


def test_micro_batch_size_sets_the_number_of_micro_batches():
    pipe = Pipeline([Mlp()] * 4, 2, 1, micro_batch_size=3)
    x = tf.random.normal([10, DIMS])
    AssertSame(*PipelineAndReference(pipe, (x,)))
    assert pipe.PartitionReport().num_micro_batches == 4  # ceil(10 / 3)


def test_nested_map_state_carries_a_skip_connection_across_stages():
    cells = [
        SkipCell.Params().Set(mode="save"),
        SkipCell.Params(),
        SkipCell.Params(),
        SkipCell.Params().Set(mode="add"),
    ]
    pipe = Pipeline(cells, 4, 4, "always")
    state = NestedMap(x=tf.random.normal([8, DIMS]), skip=tf.zeros([8, DIMS]))
    got, want = PipelineAndReference(pipe, (state,))
    AssertSame(got, want)
    assert isinstance(got[0], NestedMap)
    # The skip really crossed three stage boundaries: it is the input x.
    np.testing.assert_array_equal(got[0].skip.numpy(), state.x.numpy())


def test_unbatched_argument_goes_whole_to_every_micro_batch():
    class AddTable(base_layer.BaseLayer):
        def FProp(self, theta, x, table):
            return x + table, table

    cells = [AddTable.Params(), Mlp(), AddTable.Params()]
    cells[1] = TupleMlp()
    pipe = Pipeline(cells, 3, 3, "always")
    # Batch 6, table [8]: a leaf is split only when its size along batch_dim is the batch.
    x, table = tf.random.normal([6, DIMS]), tf.random.normal([DIMS])

    def Loss(outputs):
        return SquareLoss(outputs[0])

    got, want = PipelineAndReference(pipe, (x, table), Loss)
    AssertSame(got, want)


def TupleMlp():
    class ProjKeep(base_layer.BaseLayer):
        @classmethod
        def Params(cls):
            p = super().Params()
            p.Define("proj", Mlp(), "Projection.")
            return p

        def __init__(self, params):
            super().__init__(params)
            self.CreateChild("proj", self.params.proj)

        def FProp(self, theta, x, table):
            return self.proj.FProp(theta.proj, x), table

    return ProjKeep.Params()


@pytest.mark.parametrize("remat", ["always", "except_last", "never"])
def test_dropout_same_seeds_and_recompute_reproduces_it(remat):
    pipe = Pipeline([MlpWithDropout()] * 4, 2, 4, remat)
    x = tf.random.normal([8, DIMS])
    with seeds.StepSeedScope(17):
        got, want = PipelineAndReference(pipe, (x,))
    AssertSame(got, want)
    # Dropout really dropped something.
    assert np.mean(PlainStack(pipe, x).numpy() == 0) < 1
    with seeds.StepSeedScope(18):
        other, _ = PipelineAndReference(pipe, (x,))
    assert not np.allclose(other[0].numpy(), got[0].numpy())


@pytest.mark.parametrize("remat", ["always", "never"])
def test_batch_norm_moments_summed_over_micro_batches_and_updated_once(remat):
    pipe = Pipeline([MlpWithBatchNorm()] * 2, 2, 4, remat)
    bn = pipe.cell_1.sub[1]
    x = tf.random.normal([10, DIMS]) * 3 + 5

    # What the BN layer of cell 1 sees for the whole batch: cell 0's output, then cell 1's
    # projection (cell 0's BN normalizes each micro-batch with its own moments).
    @tf.function
    def Step():
        with tf.GradientTape() as tape:
            out = pipe.FProp(pipe.theta, x)
            loss = SquareLoss(out)
        return tape.gradient(loss, pipe.trainable_variables)

    before = bn.vars.moving_mean.numpy(), bn.vars.moving_variance.numpy()
    with base_layer.EvalMode(False):
        ref_inputs = []
        for m, rows in enumerate(tf.split(x, [3, 3, 2, 2])):
            with seeds.StepSeedScope(m):
                h = pipe.cell_0.FProp(pipe.cell_0.theta, rows)
                ref_inputs.append(pipe.cell_1.sub[0].FProp(pipe.cell_1.theta.sub[0], h))
    # ref_inputs above used cell_0's BN without a stats context: undo its update.
    pipe.cell_0.sub[1].vars.moving_mean.assign(tf.zeros([DIMS]))
    pipe.cell_0.sub[1].vars.moving_variance.assign(tf.ones([DIMS]))
    full = tf.concat(ref_inputs, 0).numpy()
    Step()
    mean, var = full.mean(0), full.var(0)
    np.testing.assert_allclose(
        bn.vars.moving_mean.numpy(), 0.9 * before[0] + 0.1 * mean, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        bn.vars.moving_variance.numpy(), 0.9 * before[1] + 0.1 * var, rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("remat", ["always", "except_last", "never"])
def test_batch_norm_pipeline_equals_reference_including_moving_stats(remat):
    pipe = Pipeline([MlpWithBatchNorm()] * 4, 4, 4, remat)
    # 8 rows per micro-batch: batch norm over 2 rows would amplify rounding by 1/std.
    x = tf.random.normal([32, DIMS]) * 2 + 1
    variables = [v for v in pipe.variables if not v.trainable]
    start = [v.numpy() for v in variables]
    got, _ = PipelineAndReference(pipe, (x,))
    after_pipe = [v.numpy() for v in variables]
    for v, s in zip(variables, start):
        v.assign(s)
    _, want = PipelineAndReference(pipe, (x,))
    after_ref = [v.numpy() for v in variables]
    AssertSame(got, want)
    test_utils.AssertAllClose(after_pipe, after_ref)
    assert not np.allclose(after_pipe[0], start[0])  # they did move, once


def test_eval_runs_the_same_pipeline_without_custom_gradients():
    pipe = Pipeline([MlpWithBatchNorm()] * 4, 2, 4)
    x = tf.random.normal([8, DIMS])
    with base_layer.EvalMode():
        fn = tf.function(lambda: pipe.FProp(pipe.theta, x))
        got = fn()
        want = pipe.FPropSequential(pipe.theta, x)
        graph = fn.get_concrete_function().graph
    test_utils.AssertAllClose(got, want)
    assert not [op for op in graph.get_operations() if op.type == "IdentityN"]
    names = " ".join(op.name for op in graph.get_operations())
    assert "F_s1_mb3/" in names and "B_s" not in names  # the forward-only schedule
    assert Misplaced(graph) == []
    assert {op.device for op in graph.get_operations() if op.type == "Tanh"} == {
        "/device:CPU:0",
        "/device:CPU:1",
    }


def test_eager_equals_function():
    pipe = Pipeline([Mlp()] * 4, 2, 4)
    x = tf.random.normal([8, DIMS])
    AssertSame(*PipelineAndReference(pipe, (x,), use_function=False))
    test_utils.AssertEagerEqualsFunction(lambda t: pipe(t), x, atol=1e-5)


@pytest.mark.parametrize("remat", ["always", "except_last"])
def test_unknown_batch_is_split_at_run_time(remat):
    """One trace with batch None serves batches 10 and 7 (M=4): FProp and its gradient,
    ForwardBackward and FPropSequential all equal the reference of that batch."""
    pipe = Pipeline([Mlp()] * 4, 2, 4, remat)
    spec = [tf.TensorSpec([None, DIMS])]

    @tf.function(input_signature=spec, autograph=False)
    def Step(x):
        with tf.GradientTape() as tape:
            loss = SquareLoss(pipe.FProp(pipe.theta, x))
        out = pipe.ForwardBackward(pipe.theta, (x,), lambda y, _: {"loss": (SquareLoss(y), 1.0)})
        grads = tape.gradient(loss, pipe.trainable_variables)
        return loss, grads, out.metrics.loss[0], pipe.FPropSequential(pipe.theta, x)

    for batch in (10, 7):
        x = tf.random.normal([batch, DIMS])
        loss, grads, fb_loss, sequential_out = Step(x)
        _, want_loss, want_grads = PipelineAndReference(pipe, (x,), use_function=False)[1]
        np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
        np.testing.assert_allclose(fb_loss, want_loss / 4, rtol=1e-5)  # mean of 4 losses
        for g, w in zip(grads, want_grads):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
        test_utils.AssertAllCloseToScale(sequential_out, PlainStack(pipe, x))
    assert Step.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("schedule", ["gpipe", "zbv", "v_half", "v_min"])
def test_tf_gradients_through_the_one_engine_equal_the_reference(schedule):
    """tf.gradients of FProp (traced) equals the tape over the sequential reference,
    under loop and V placement."""
    pipe = Pipeline([Mlp()] * 4, 2, 4, "except_last", schedule=schedule)
    x = tf.random.normal([8, DIMS])

    @tf.function(autograph=False)
    def Step():
        outputs = pipe.FProp(pipe.theta, x)
        return outputs, tf.gradients(SquareLoss(outputs), list(pipe.trainable_variables) + [x])

    outputs, grads = Step()
    with tf.GradientTape() as tape:
        tape.watch(x)
        want = pipe.FPropSequential(pipe.theta, x)
        loss = SquareLoss(want)
    want_grads = tape.gradient(loss, list(pipe.trainable_variables) + [x])
    test_utils.AssertAllCloseToScale(outputs, want)
    for g, w in zip(grads, want_grads):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("schedule", ["v_half", "v_min"])
def test_a_training_step_under_v_half_and_v_min_equals_the_plain_stacks(schedule):
    """ForwardBackward runs the schedule (8 stages on the V of 4 devices, M=8), traced as a
    train step, and an SGD step with its gradients: the loss, the gradients and the
    weights after the step equal the plain stack's on the whole batch."""
    pipe = Pipeline([Mlp()] * 8, 4, 8, "except_last", schedule=schedule)
    assert pipe.Schedule(8).stage_devices == (0, 1, 2, 3, 3, 2, 1, 0)
    x = tf.random.normal([16, DIMS])
    variables = list(pipe.trainable_variables)
    start = [v.numpy() for v in variables]

    def Loss(outputs, _=None):  # the mean over rows: micro-batches weigh by their rows
        return NestedMap(
            loss=(tf.reduce_mean(tf.square(outputs)), tf.cast(tf.shape(outputs)[0], tf.float32))
        )

    @tf.function(autograph=False)
    def Step():
        out = pipe.ForwardBackward(pipe.theta, (x,), Loss)
        by_ref = {
            v.ref(): g
            for v, g in zip(tf.nest.flatten(pipe.theta), tf.nest.flatten(out.theta_grads))
        }
        grads = [by_ref[v.ref()] for v in variables]
        for v, g in zip(variables, grads):
            v.assign_sub(0.1 * g)
        return out.metrics.loss[0], grads

    loss, grads = Step()
    stepped = [v.numpy() for v in variables]
    for v, s in zip(variables, start):
        v.assign(s)
    with tf.GradientTape() as tape:
        want_loss = Loss(PlainStack(pipe, x)).loss[0]
    want_grads = tape.gradient(want_loss, variables)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    scale = max(float(np.max(np.abs(g))) for g in want_grads)
    for g, w, s, after in zip(grads, want_grads, start, stepped):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * scale)
        np.testing.assert_allclose(after, s - 0.1 * w.numpy(), rtol=1e-5, atol=1e-6)
