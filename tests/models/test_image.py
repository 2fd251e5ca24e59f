"""AmoebaNetClassifier: cells, pipelined equals unpipelined, batch norm, errors, learning."""

import time

import numpy as np
import pytest
import tensorflow as tf

from lingpipe import base_layer, model_registry, test_utils
from lingpipe.inputs import image as image_input
from lingpipe.layers import normalization
from lingpipe.models import amoeba_cells, image
from lingpipe.nested_map import NestedMap

# A two-pair genotype for the pipeline tests: the real ones trace ~4x more ops. It keeps
# what matters: both inputs, strided ops and identity, pair sums, concat of unused states.
SMALL_GENOTYPE = {
    "normal": (
        ("separable_3x3_1", "none", "avg_pool_3x3", "max_pool_3x3"),
        (0, 1, 2, 0),
        (1, 0, 0, 0),
    ),
    "reduction": (
        ("separable_3x3_1", "max_pool_3x3", "none", "avg_pool_3x3"),
        (1, 0, 0, 2),
        (1, 1, 0, 0),
    ),
}


@pytest.fixture(scope="module")
def small():
    amoeba_cells.GENOTYPES["test_small"] = SMALL_GENOTYPE
    yield
    del amoeba_cells.GENOTYPES["test_small"]


def TaskParams(**kw):
    p = image.AmoebaNetClassifier.Params().Set(
        name="image",
        filters=8,
        num_normal_cells=1,
        num_reduction_cells=1,
        image_size=8,
        channels=1,
        num_classes=10,
        genotype="test_small",
        batch_norm_decay=0.9,
    )
    return p.Set(**kw)


def Batch(n=16, size=8, seed=0):
    images = tf.constant(np.random.default_rng(seed).uniform(size=[n, size, size, 1]), tf.float32)
    return NestedMap(images=images, labels=tf.constant(np.arange(n) % 10, tf.int32))


def Values(task):
    return {v.name: v.numpy() for v in task.variables}


def LossAndGrads(task, batch, sequential=False):
    """(loss, {name: gradient}) of the task: pipelined, or the pipeline's sequential reference."""
    variables = task.trainable_variables
    with tf.GradientTape() as tape:
        if sequential:
            state = NestedMap(images=batch.images, labels=batch.labels)
            predictions = task.pipeline.FPropSequential(task.theta.pipeline, state)
            metrics = task.ComputeLoss(task.theta, predictions, batch)
        else:
            metrics = task.FProp(task.theta, batch)
    grads = tape.gradient(metrics.loss[0], variables)
    return metrics.loss[0], {v.name: g for v, g in zip(variables, grads)}


def Traced(task, batch):
    return tf.function(lambda: LossAndGrads(task, batch), autograph=False)()


def AssertSame(got, want):
    (loss_g, grads_g), (loss_w, grads_w) = got, want
    np.testing.assert_allclose(loss_g.numpy(), loss_w.numpy(), rtol=test_utils.RTOL)
    assert sorted(grads_g) == sorted(grads_w)
    assert all(g is not None for g in grads_g.values()), "a variable got no gradient"
    # Against the scale of all gradients (as tests/pipeline/gpipe_cells.AssertSame): a
    # shift that a later batch norm removes (a BN beta whose state feeds only a pooling
    # and a BN) has a gradient of 0 in exact arithmetic, here rounding noise alone.
    scale = max(float(np.max(np.abs(g))) for g in grads_w.values())
    for name in sorted(grads_w):
        np.testing.assert_allclose(
            grads_g[name],
            grads_w[name],
            rtol=test_utils.RTOL,
            atol=test_utils.RTOL * scale,
            err_msg=name,
        )


def test_cells_follow_the_amoeba_net_layout():
    p = TaskParams(genotype="amoeba_net_a", filters=16, num_normal_cells=2)
    task = p.Instantiate()
    cells = task.pipeline.Cells()

    def Get(c, name):
        return c.params.Get(name) if name in c.params else None

    kinds = [(type(c).__name__, Get(c, "filters"), Get(c, "reduction")) for c in cells]
    assert kinds == [
        ("StemCell", 16, None),
        ("AmoebaCell", 16, False),
        ("AmoebaCell", 16, False),
        ("AmoebaCell", 32, True),
        ("AmoebaCell", 32, False),
        ("AmoebaCell", 32, False),
        ("HeadCell", None, None),
    ]
    # The cell after a reduction gets a prev twice as large, with half the channels.
    after = cells[4].params
    assert (after.x_channels, after.prev_channels, after.prev_stride) == (32, 16, 2)
    assert [v.shape.as_list() for v in cells[4].prev_adjust.variables][:1] == [[1, 1, 16, 32]]
    assert cells[2].prev_adjust.variables == () and cells[2].x_adjust.variables == ()
    batch = Batch(4)
    state = cells[0].FProp(cells[0].theta, NestedMap(images=batch.images, labels=batch.labels))
    for cell in cells[1:4]:
        state = cell.FProp(cell.theta, state)
    assert state.x.shape == (4, 4, 4, 32) and state.prev.shape == (4, 8, 8, 16)


def test_fprop_meta_counts_every_variable_and_builds_nothing():
    p = TaskParams(genotype="amoeba_net_a")
    with test_utils.CountVariables() as counter:
        pipeline_p = image.AmoebaNetClassifier.PipelineParams(p, "image")
        meta = pipeline_p.cls.FPropMeta(pipeline_p, image.AmoebaNetClassifier.InputShape(p, 4))
    assert counter.count == 0
    task = p.Instantiate()
    # All variables: trainable ones and batch norm's moving statistics.
    assert meta.num_params == sum(v.shape.num_elements() for v in task.variables)
    out = meta.out_shapes[0]
    assert (out.xent.as_list(), out.correct.as_list(), out.logits.as_list()) == ([4], [4], [4, 10])
    predictions = task.ComputePredictions(task.theta, Batch(4))
    assert {k: v.shape.as_list() for k, v in predictions.items()} == {
        k: v.as_list() for k, v in out.items()
    }


def test_normal_cell_wires_the_amoeba_net_a_genotype():
    cell = amoeba_cells.AmoebaCell.Params().Set(
        name="cell", genotype="amoeba_net_a", filters=8, x_channels=8, prev_channels=8
    )
    cell = cell.Instantiate()
    x, prev = tf.random.normal([4, 6, 6, 8]), tf.random.normal([4, 6, 6, 8])
    out = cell.FProp(cell.theta, NestedMap(x=x, prev=prev, labels=tf.zeros([4], tf.int32)))
    # AmoebaNet-A's normal cell, written out: states 0 = x, 1 = prev, 2.. = pair sums;
    # the output concatenates the states the genotype marks unused (prev, h3, h4, h6).
    ops = ["avg_pool_3x3", "max_pool_3x3", "separable_3x3_2", "none", "none"]
    ops += ["avg_pool_3x3", "separable_3x3_2", "separable_5x5_2", "avg_pool_3x3", "separable_3x3_2"]
    assert [op.params.op for op in cell.op] == ops

    def Op(i, h):
        return cell.op[i].FProp(cell.theta.op[i], h)

    with normalization.SuspendBatchNormUpdates():
        h2 = Op(0, x) + Op(1, x)
        h3 = Op(2, prev) + Op(3, prev)
        h4 = Op(4, x) + Op(5, prev)
        h5 = Op(6, x) + Op(7, h2)
        h6 = Op(8, h5) + Op(9, x)
        want = cell.proj.FProp(cell.theta.proj, tf.concat([prev, h3, h4, h6], -1))
    test_utils.AssertAllClose(out.x, want)
    np.testing.assert_array_equal(out.prev.numpy(), x.numpy())


def test_strided_identity_is_relu_conv_1x1_batch_norm():
    op = amoeba_cells.AmoebaOp.Params().Set(
        name="op", op="none", in_channels=3, filters=5, stride=2
    )
    op = op.Instantiate()
    x = tf.random.normal([2, 8, 8, 3])
    got = op.FProp(op.theta, x).numpy()
    w = op.vars.step[0].w.numpy()[0, 0]
    y = np.einsum("bhwc,cd->bhwd", np.maximum(x.numpy(), 0)[:, ::2, ::2], w)
    mean, var = y.mean((0, 1, 2)), y.var((0, 1, 2))
    np.testing.assert_allclose(got, (y - mean) / np.sqrt(var + 1e-3), rtol=1e-4, atol=1e-5)
    identity = op.params.Copy().Set(stride=1, in_channels=5).Instantiate()
    assert identity.variables == () and identity.FProp(identity.theta, got) is got


def test_weights_are_the_same_for_any_number_of_stages(small):
    ref = Values(TaskParams().Instantiate())
    for k in (2, 4):
        got = Values(TaskParams(num_stages=k, num_micro_batches=4).Instantiate())
        assert sorted(got) == sorted(ref)
        for name in ref:
            np.testing.assert_array_equal(got[name], ref[name], err_msg=name)


@pytest.mark.parametrize("k", [2, 4])
def test_pipelined_with_one_micro_batch_equals_unpipelined(small, k):
    batch = Batch()
    pipelined = TaskParams(num_stages=k).Instantiate()
    plain = TaskParams().Instantiate()
    assert len(set(pipelined.pipeline.devices)) == k
    want = Values(plain)
    for name, value in Values(pipelined).items():
        np.testing.assert_array_equal(value, want[name], err_msg=name)
    AssertSame(Traced(pipelined, batch), LossAndGrads(plain, batch))


def PipelinedAndReference(k):
    """A K-stage, 4-micro-batch task's traced step and its sequential reference, from the
    same moving statistics; the traced step's graph; the statistics after each."""
    batch = Batch()
    task = TaskParams(num_stages=k, num_micro_batches=4).Instantiate()
    moving = [v for v in task.variables if not v.trainable]
    start = [v.numpy() for v in moving]
    fn = tf.function(lambda: LossAndGrads(task, batch), autograph=False)
    got = fn()
    after_pipeline = [v.numpy() for v in moving]
    for v, s in zip(moving, start):
        v.assign(s)
    want = LossAndGrads(task, batch, sequential=True)
    return NestedMap(
        task=task,
        batch=batch,
        graph=fn.get_concrete_function().graph,
        got=got,
        want=want,
        start=start,
        after_pipeline=after_pipeline,
        after_reference=[v.numpy() for v in moving],
    )


@pytest.fixture(scope="module")
def k2(small):
    return PipelinedAndReference(2)


@pytest.mark.parametrize("k", [pytest.param(2, marks=pytest.mark.extended), 4])
def test_micro_batches_equal_the_sequential_reference(small, request, k):
    """Batch norm couples a micro-batch's examples: the reference is the same micro-batches."""
    run = request.getfixturevalue("k2") if k == 2 else PipelinedAndReference(k)
    AssertSame(run.got, run.want)
    test_utils.AssertAllClose(run.after_pipeline, run.after_reference)
    # The comparison means something: whole-batch moments give another loss.
    whole, _ = LossAndGrads(TaskParams().Instantiate(), run.batch)
    assert abs(float(whole) - float(run.got[0])) > 1e-3


def test_batch_norm_moving_averages_are_updated_once_per_step(k2):
    # Each moving statistic is assigned by exactly one op of the traced step.
    graph = k2.graph
    outer_of = {inner.ref(): outer for outer, inner in graph.captures}
    moving = {v.handle.ref(): v.name for v in k2.task.variables if not v.trainable}
    assigned = []
    for op in graph.get_operations():
        outer = outer_of.get(op.inputs[0].ref()) if op.type == "AssignVariableOp" else None
        if outer is not None and outer.ref() in moving:
            assigned.append(moving[outer.ref()])
    assert sorted(assigned) == sorted(moving.values())
    # With the statistics of the whole batch (not of the last micro-batch, nor updated
    # four times): the stem's batch norm normalizes conv(images), from 0 and 1.
    stem = k2.task.pipeline.cell_0
    names = [v.name for v in k2.task.variables if not v.trainable]
    mean = k2.after_pipeline[names.index(stem.vars.bn.moving_mean.name)]
    variance = k2.after_pipeline[names.index(stem.vars.bn.moving_variance.name)]
    conv = tf.nn.conv2d(k2.batch.images, stem.vars.conv.w, 1, "SAME").numpy()
    np.testing.assert_allclose(mean, 0.1 * conv.mean((0, 1, 2)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(variance, 0.9 + 0.1 * conv.var((0, 1, 2)), rtol=1e-5)


def test_eval_uses_moving_statistics_and_equals_the_reference(small):
    batch = Batch()
    task = TaskParams(num_stages=2, num_micro_batches=4).Instantiate()
    LossAndGrads(task, batch)  # moves the statistics once
    with base_layer.EvalMode():
        got = tf.function(lambda: task.FProp(task.theta, batch), autograph=False)()
        state = NestedMap(images=batch.images, labels=batch.labels)
        want = task.pipeline.FPropSequential(task.theta.pipeline, state)
        # No batch coupling in eval: 4 examples (1 per micro-batch) as in the whole batch.
        first = tf.nest.map_structure(lambda t: t[:4], batch)
        alone = task.ComputePredictions(task.theta, first)
    test_utils.AssertAllClose(got.loss[0], tf.reduce_mean(want.xent))
    test_utils.AssertAllClose(alone.logits, want.logits[:4], atol=1e-5)


def test_tiny_runs_a_train_step_with_a_gradient_for_every_variable():
    p = model_registry.GetParams("image.AmoebaNetDigitsTiny", "Train")
    task = p.Instantiate()
    batch = next(iter(task.CreateInputGenerator().GetDataset()))
    _, grads = LossAndGrads(task, batch)
    assert [n for n, g in grads.items() if g is None] == []
    task.CreateOptimizer()
    before = Values(task)
    metrics = task.TrainStep(batch, 0)  # eagerly: the traced step is the learning test's
    assert np.isfinite(metrics.loss[0].numpy())
    unchanged = [n for n, v in Values(task).items() if np.array_equal(v, before[n])]
    assert unchanged == []


def test_imagenet_config_matches_amoeba_net_b_18_512():
    keys = model_registry.ListKeys("image")
    assert keys == ["image.AmoebaNetDigitsTiny", "image.AmoebaNetImageNetGPipe"]
    with test_utils.CountVariables() as counter:
        for dataset in ("Train", "Dev", "Test"):
            p = model_registry.GetParams("image.AmoebaNetImageNetGPipe", dataset)
        pipeline_p = image.AmoebaNetClassifier.PipelineParams(p, "image")
        meta = pipeline_p.cls.FPropMeta(pipeline_p, image.AmoebaNetClassifier.InputShape(p, 1))
    assert counter.count == 0
    assert (p.genotype, p.num_normal_cells, p.filters, p.image_size) == (
        "amoeba_net_b",
        6,
        512,
        480,
    )
    print(f"AmoebaNet-B (18, 512): {meta.num_params / 1e6:.1f}M parameters (paper: 557M)")
    assert 0.85 * 557e6 < meta.num_params < 1.15 * 557e6
    assert pipeline_p.num_stages == 8 and p.input.image_size == 480


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(filters=0), "expected filters to be a positive integer, received filters=0"),
        (dict(num_normal_cells=0), "expected num_normal_cells to be a positive integer"),
        (dict(num_reduction_cells=0), "expected num_reduction_cells to be a positive integer"),
        (dict(num_classes=-1), "expected num_classes to be a positive integer"),
        (dict(image_size=0), "expected image_size to be a positive integer"),
        (dict(genotype="amoeba_net_z"), r"expected genotype to be one of \['amoeba_net_a'"),
        (dict(num_stem_reduction_cells=4), "expected filters to be divisible by 2\\*\\*num_stem"),
        (dict(label_smoothing=1.5), "expected 0 <= label_smoothing < 1"),
        (dict(partition="flops"), "partition='flops' needs the batch size"),
    ],
)
def test_bad_params_are_rejected_with_their_values(overrides, message):
    p = TaskParams(genotype="amoeba_net_a").Set(**overrides)
    with pytest.raises(ValueError, match=message):
        p.Instantiate()


def test_images_of_another_size_are_rejected():
    task = TaskParams(genotype="amoeba_net_a").Instantiate()
    message = (
        r"image: expected images of shape \[batch, image_size, image_size, channels\] = "
        r"\[batch, 8, 8, 1\], received images.shape=\[4, 16, 16, 1\]"
    )
    with pytest.raises(ValueError, match=message):
        task.FProp(task.theta, Batch(4, size=16))


def test_input_params_of_another_image_size_are_rejected():
    p = model_registry.GetParams("image.AmoebaNetImageNetGPipe", "Train")
    p.image_size = 224
    message = "expected the input's image_size to equal image_size, received input.image_size=480"
    with pytest.raises(ValueError, match=message + ", image_size=224"):
        p.Instantiate()


def test_bad_operations_and_genotypes_are_rejected(monkeypatch):
    op = amoeba_cells.AmoebaOp.Params().Set(name="op", op="conv_3x3", in_channels=4, filters=4)
    with pytest.raises(ValueError, match="op: unknown AmoebaNet operation 'conv_3x3'; expected"):
        op.Instantiate()
    ops = SMALL_GENOTYPE["reduction"][0]
    bad = dict(SMALL_GENOTYPE, reduction=(ops, (0, 0, 2, 0), (1, 0, 0, 0)))  # prev unused
    monkeypatch.setitem(amoeba_cells.GENOTYPES, "bad", bad)
    with pytest.raises(ValueError, match="a reduction cell must consume both of its inputs"):
        TaskParams(genotype="bad").Instantiate()


@pytest.mark.slow
@pytest.mark.extended  # test_micro_batches_equal_the_sequential_reference[4] stays
def test_amoeba_net_a_pipeline_equals_its_references():
    """The real genotype: 4 stages x 4 micro-batches, and 2 stages x 1 vs unpipelined."""
    batch = Batch()
    p = TaskParams(genotype="amoeba_net_a")
    task = p.Copy().Set(num_stages=4, num_micro_batches=4).Instantiate()
    AssertSame(Traced(task, batch), LossAndGrads(task, batch, sequential=True))
    pipelined = p.Copy().Set(num_stages=2).Instantiate()
    AssertSame(Traced(pipelined, batch), LossAndGrads(p.Instantiate(), batch))


@pytest.mark.slow
@pytest.mark.extended  # test_lm's tiny model learns in the default run
def test_tiny_learns_the_digits_over_two_stages():
    start = time.time()
    p = model_registry.GetParams("image.AmoebaNetDigitsTiny", "Train")
    assert (p.num_stages, p.num_micro_batches) == (2, 2)
    task = p.Instantiate()
    task.CreateOptimizer()
    train = iter(task.CreateInputGenerator().GetDataset())
    test_p = model_registry.GetParams("image.AmoebaNetDigitsTiny", "Test").input
    test = list(test_p.Instantiate().Batches())
    assert (
        sum(len(b.labels) for b in test)
        == image_input.DigitsInput.Params().Set(split="test").Instantiate().NumExamples()
    )
    step_fn = tf.function(task.TrainStep, autograph=False)
    with base_layer.EvalMode():
        eval_fn = tf.function(task.EvalStep, autograph=False)

    def Accuracy():
        return float(np.mean([eval_fn(b).accuracy[0].numpy() for b in test]))

    # The test set is evaluated once, at the end: the loss shows the way there.
    print("\nstep  train_loss  seconds")
    for step in range(150):
        metrics = step_fn(next(train), tf.constant(step))
        if (step + 1) % 25 == 0:
            loss, seconds = float(metrics.loss[0]), time.time() - start
            print(f"{step + 1:4d}  {loss:10.4f}  {seconds:7.1f}")
    accuracy = Accuracy()
    print(f"test accuracy {accuracy:.3f}")
    assert accuracy > 0.9
