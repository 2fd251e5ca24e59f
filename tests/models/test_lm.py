"""TransformerLm: pipelined equals unpipelined, tied embeddings, errors, params, learning."""

import functools
import math
import time

import numpy as np
import pytest
import tensorflow as tf

from lingpipe import model_registry, test_utils
from lingpipe.inputs import text_lm
from lingpipe.layers import gpipe, positions
from lingpipe.models import lm
from lingpipe.nested_map import NestedMap

VOCAB, DIMS, BATCH, TIME = 11, 8, 8, 5


def LmParams(num_stages=1, num_micro_batches=1, **kw):
    return lm.TransformerLm.Params().Set(
        name="lm",
        vocab_size=VOCAB,
        model_dims=DIMS,
        num_layers=2,
        num_heads=2,
        hidden_dims=16,
        max_len=16,
        num_stages=num_stages,
        num_micro_batches=num_micro_batches,
        **kw,
    )


def Batch(seed=0):
    """Random ids; the last two positions of the first two rows are padding."""
    rng = np.random.RandomState(seed)
    ids = rng.randint(3, VOCAB, size=(BATCH, TIME)).astype(np.int32)
    labels = np.roll(ids, -1, axis=1)
    paddings = np.zeros([BATCH, TIME], np.float32)
    paddings[:2, -2:] = 1.0
    return NestedMap(
        ids=tf.constant(ids),
        labels=tf.constant(labels),
        paddings=tf.constant(paddings),
        weights=tf.constant(1.0 - paddings),
    )


def LossAndGrads(task, batch, fprop=None):
    """(metrics, gradients of the loss for task.trainable_variables)."""
    with tf.GradientTape() as tape:
        metrics = fprop() if fprop else task.FProp(task.theta, batch)
    return metrics, tape.gradient(metrics.loss[0], task.trainable_variables)


def AssertGradsClose(got, want, rtol=test_utils.RTOL):
    """Relative to the scale of all gradients, as tests/pipeline/gpipe_cells.AssertSame."""
    assert all(g is not None for g in got), "a variable got no gradient"
    got = [np.asarray(tf.convert_to_tensor(g)) for g in got]
    want = [np.asarray(tf.convert_to_tensor(w)) for w in want]
    scale = max(float(np.max(np.abs(w))) for w in want)
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * scale, err_msg=f"gradient {i}")


@functools.cache
def PipelinedAndReference(num_stages, tied):
    """(task, ref, batch, (metrics, grads) pipelined with M=4, the same unpipelined).

    Cached: tracing a pipeline takes seconds, and two tests read the tied one.
    """
    kw = dict(tie_embeddings=tied, label_smoothing=0.1)
    ref = LmParams(**kw).Instantiate()
    task = LmParams(num_stages, 4, **kw).Instantiate()
    batch = Batch()
    got = tf.function(lambda: LossAndGrads(task, batch), autograph=False)()
    return task, ref, batch, got, LossAndGrads(ref, batch)


@pytest.mark.parametrize("num_stages, tied", [(2, True), (4, False)])
def test_pipelined_equals_unpipelined(num_stages, tied):
    task, ref, _, (got_metrics, got_grads), (want_metrics, want_grads) = PipelinedAndReference(
        num_stages, tied
    )
    assert [v.name for v in task.trainable_variables] == [v.name for v in ref.trainable_variables]
    for v, w in zip(task.trainable_variables, ref.trainable_variables):
        np.testing.assert_array_equal(v.numpy(), w.numpy(), err_msg=v.name)
    assert task.pipeline.stage_cells == (
        [[0, 1], [2, 3]] if num_stages == 2 else [[0], [1], [2], [3]]
    )
    assert ref.pipeline.stage_cells == [[0, 1, 2, 3]]
    for name in ("loss", "log_pplx", "fraction_of_correct_next_step_preds"):
        np.testing.assert_allclose(
            got_metrics[name][0], want_metrics[name][0], rtol=test_utils.RTOL, err_msg=name
        )
        assert float(got_metrics[name][1]) == BATCH * TIME - 4  # the total weight
    assert float(want_metrics.log_pplx[0]) < float(want_metrics.loss[0])  # smoothing adds
    AssertGradsClose(got_grads, want_grads)


def test_tied_embeddings_one_variable_on_first_stage():
    task = PipelinedAndReference(2, True)[0]
    tables = [v for v in task.variables if v.shape.as_list() == [VOCAB, DIMS]]
    assert [v.name for v in tables] == ["lm/emb:0"]
    assert tables[0].device.endswith(task.pipeline.devices[0])
    assert task.pipeline.devices[0] != task.pipeline.devices[1]
    untied = PipelinedAndReference(4, False)[0]
    names = sorted(v.name for v in untied.variables if VOCAB in v.shape.as_list())
    assert names == [
        "lm/pipeline/cell_0/emb/emb:0",
        "lm/pipeline/cell_3/softmax/bias:0",
        "lm/pipeline/cell_3/softmax/weight:0",
    ]


def _PlainTiedLoss(task, batch, lookup_table, softmax_table):
    """The cells one after another on the whole batch, each end with its own table."""
    cells = task.pipeline.Cells()
    thetas = [task.theta.pipeline[f"cell_{i}"] for i in range(len(cells))]
    state = NestedMap(batch, tied_emb=lookup_table[tf.newaxis])
    state = cells[0].FProp(thetas[0], state)
    state.tied_emb = softmax_table[tf.newaxis]
    for cell, theta in zip(cells[1:], thetas[1:]):
        state = cell.FProp(theta, state)
    return task.ComputeLoss(task.theta, state, batch)


def test_tied_gradient_is_the_sum_of_both_uses():
    task, ref, batch, (_, got), (_, want) = PipelinedAndReference(2, True)
    emb = ref.vars.emb

    def UseGrad(lookup_stopped):
        with tf.GradientTape() as tape:
            table = tf.convert_to_tensor(emb)
            stopped = tf.stop_gradient(tf.identity(table))
            lookup, sm = (stopped, table) if lookup_stopped else (table, stopped)
            loss = _PlainTiedLoss(ref, batch, lookup, sm).loss[0]
        return tf.convert_to_tensor(tape.gradient(loss, emb)).numpy()

    lookup_grad, softmax_grad = UseGrad(False), UseGrad(True)
    # The lookup path only reaches the rows of ids in the batch; the softmax, all rows.
    unused = sorted(set(range(VOCAB)) - set(batch.ids.numpy().ravel()))
    assert unused == [0, 1, 2]
    np.testing.assert_array_equal(lookup_grad[unused], 0.0)
    assert np.all(np.abs(softmax_grad[unused]).sum(axis=1) > 0)
    assert np.abs(lookup_grad[3:]).sum() > 0

    index = [v.name for v in task.trainable_variables].index("lm/emb:0")
    both = lookup_grad + softmax_grad
    atol = test_utils.RTOL * np.max(np.abs(both))
    want_emb = tf.convert_to_tensor(want[index]).numpy()
    got_emb = tf.convert_to_tensor(got[index]).numpy()
    np.testing.assert_allclose(want_emb, both, rtol=test_utils.RTOL, atol=atol)
    np.testing.assert_allclose(got_emb, both, rtol=test_utils.RTOL, atol=atol)


def test_softmax_cell_against_numpy():
    task = LmParams(label_smoothing=0.2).Instantiate()
    batch = Batch(2)
    cell = task.pipeline.Cells()[-1]
    x = np.random.RandomState(3).normal(size=[BATCH, TIME, DIMS]).astype(np.float32)
    out = cell.FProp(cell.theta, NestedMap(batch, x=tf.constant(x)))
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    normed = (x - mean) / np.sqrt(var + 1e-6)  # LayerNorm starts as scale 1, bias 0
    logits = normed @ cell.vars.softmax.weight.numpy() + cell.vars.softmax.bias.numpy()
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    labels = batch.labels.numpy()
    nll = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    xent = 0.8 * nll - 0.2 * log_probs.mean(-1)
    np.testing.assert_allclose(out.nll, nll, rtol=1e-5)
    np.testing.assert_allclose(out.xent, xent, rtol=1e-5)
    np.testing.assert_array_equal(out.correct, (logits.argmax(-1) == labels).astype(np.float32))
    metrics = task.ComputeLoss(task.theta, out, batch)
    w = batch.weights.numpy()
    np.testing.assert_allclose(metrics.loss[0], (xent * w).sum() / w.sum(), rtol=1e-5)
    np.testing.assert_allclose(metrics.log_pplx[0], (nll * w).sum() / w.sum(), rtol=1e-5)


def test_sinusoidal_positions_against_numpy():
    got = positions.Sinusoidal(7, 6).numpy()
    inv = np.exp(-np.arange(3) * math.log(1e4) / 2)
    angles = np.arange(7)[:, None] * inv[None, :]
    np.testing.assert_allclose(got, np.concatenate([np.sin(angles), np.cos(angles)], 1), atol=1e-6)
    assert positions.Sinusoidal(4, 5).numpy()[:, -1].tolist() == [0.0] * 4


def test_errors():
    with pytest.raises(
        ValueError,
        match=r"^lm: expected model_dims divisible by num_heads, received model_dims=10, "
        r"num_heads=4$",
    ):
        LmParams().Set(model_dims=10, num_heads=4).Instantiate()
    p = LmParams().Set(vocab_size=100)
    p.input = text_lm.TextLmInput.Params()
    with pytest.raises(ValueError, match=r"vocab_size=100, input.vocab_size=259"):
        p.Instantiate()
    with pytest.raises(
        ValueError, match=r"lm: expected num_layers to be a positive integer, received num_layers=0"
    ):
        LmParams().Set(num_layers=0).Instantiate()
    with pytest.raises(ValueError, match=r"partition='flops' needs the batch's shape"):
        LmParams(2).Set(partition="flops").Instantiate()
    task = LmParams().Set(max_len=4).Instantiate()
    with pytest.raises(ValueError, match=r"at most max_len=4 tokens, received ids.shape=\[8, 5\]"):
        task.FProp(task.theta, Batch())


def _StateShapes(task_p):
    shape = [task_p.input.batch_size, task_p.input.seq_len]
    return NestedMap(ids=shape, labels=shape, paddings=shape, weights=shape)


@pytest.mark.parametrize("tied", [False, True])
def test_cell_metas_match_the_built_variables(tied):
    p = LmParams(2, 2, partition="params", tie_embeddings=tied)
    p.input = text_lm.TextLmInput.Params().Set(batch_size=4, seq_len=TIME, vocab_size=VOCAB)
    task = p.Instantiate()
    pipe = task.pipeline
    metas = [
        c.params.cls.FPropMeta(c.params, s)
        for c, s in zip(pipe.Cells(), _Chain(pipe, _StateShapes(p)))
    ]
    for cell, meta in zip(pipe.Cells(), metas):
        built = sum(int(v.shape.num_elements()) for v in cell.trainable_variables)
        assert meta.num_params == built, cell.path
        assert meta.flops > 0
    assert pipe.PartitionReport().stages[0].flops > 0


def _Chain(pipe, state):
    shapes = []
    state = NestedMap({k: tf.TensorShape(v) for k, v in state.items()})
    for cell in pipe.Cells():
        shapes.append(state)
        state = cell.params.cls.FPropMeta(cell.params, state).out_shapes[0]
    return shapes


def test_registered_keys():
    assert {"lm.TransformerLmTiny", "lm.TransformerLmGPipe"} <= set(model_registry.ListKeys("lm"))
    for key in model_registry.ListKeys("lm"):
        p = model_registry.GetParams(key, "Train")
        for dataset in ("Dev", "Test"):
            assert model_registry.GetParams(key, dataset).input.split == dataset.lower()
        pipe_p = lm.TransformerLm.PipelineParams(p)
        with test_utils.CountVariables() as counter:
            meta = gpipe.PipeliningLayer.FPropMeta(pipe_p, _StateShapes(p))
        assert counter.count == 0
        assert meta.out_shapes[0].xent.as_list() == [p.input.batch_size, p.input.seq_len]
        if meta.num_params > 1e6:  # a config for accelerators: its params only
            continue
        task = p.Instantiate()
        task.CreateOptimizer()
        before = [v.numpy() for v in task.trainable_variables]
        batch = next(iter(p.input.Instantiate().GetDataset()))
        metrics = tf.function(task.TrainStep, autograph=False)(batch, tf.constant(0))
        assert np.isfinite(metrics.loss[0].numpy()), key
        assert np.isfinite(metrics.grad_norm[0].numpy()), key
        # Adam moves every weight whose gradient is not zero by about the learning rate.
        for v, old in zip(task.trainable_variables, before):
            assert np.all(np.isfinite(v.numpy())), v.name
            assert np.any(v.numpy() != old), f"{key}: {v.name} got no gradient"


def test_gpipe_config_matches_the_paper_layer():
    p = model_registry.GetParams("lm.TransformerLmGPipe", "Train")
    assert (p.model_dims, p.hidden_dims, p.num_heads, p.num_layers) == (1024, 8192, 16, 24)
    assert p.num_micro_batches >= 4 * p.num_stages
    meta = gpipe.PipeliningLayer.FPropMeta(lm.TransformerLm.PipelineParams(p), _StateShapes(p))
    assert 0.45e9 < meta.num_params < 0.55e9


@pytest.mark.slow
def test_tiny_learns_below_unigram_entropy():
    key = "lm.TransformerLmTiny"
    p = model_registry.GetParams(key, "Train")
    assert p.num_stages == 2 and p.num_micro_batches == 2
    task = p.Instantiate()
    task.CreateOptimizer()
    train = iter(task.CreateInputGenerator().GetDataset())
    dev_input = model_registry.GetParams(key, "Dev").input.Instantiate()
    dev_batches = list(dev_input.Batches(4))
    unigram = dev_input.UnigramEntropy("dev")
    train_step = tf.function(task.TrainStep, autograph=False)
    eval_step = tf.function(task.EvalStep, autograph=False)

    def DevLoss():
        metrics = [eval_step(NestedMap(b)).log_pplx for b in dev_batches]
        return sum(float(v) * float(w) for v, w in metrics) / sum(float(w) for _, w in metrics)

    start = time.time()
    print(f"dev unigram entropy {unigram:.3f} nats/byte")
    print("step  train_loss  dev_log_pplx  seconds")
    # Within the registered run's steps, checked every 50 (it gets there well before).
    for step in range(p.train.max_steps):
        metrics = train_step(next(train), tf.constant(step))
        if step % 50 == 0 or step == p.train.max_steps - 1:
            dev = DevLoss()
            print(
                f"{step:4d}  {float(metrics.loss[0]):10.3f}  {dev:12.3f}  "
                f"{time.time() - start:7.1f}"
            )
            if dev < unigram - 0.5:
                break
    assert dev < unigram - 0.5, (dev, unigram)
