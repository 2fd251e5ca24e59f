"""TransformerEncDec: pipelined equals unpipelined, greedy decoding, metrics, params, learning."""

import time

import numpy as np
import pytest
import tensorflow as tf

from lingpipe import base_layer, model_registry, test_utils
from lingpipe.inputs import seq2seq
from lingpipe.layers import gpipe
from lingpipe.models import mt
from lingpipe.nested_map import NestedMap
from lingpipe.pipeline.planning import costs

VOCAB, BATCH, SRC_LEN = 12, 8, 4


def MtParams(num_stages=1, num_micro_batches=1, **kw):
    return (
        mt.TransformerEncDec.Params()
        .Set(
            name="mt",
            vocab_size=VOCAB,
            model_dims=8,
            num_heads=2,
            hidden_dims=16,
            num_encoder_layers=1,
            num_decoder_layers=2,
            num_stages=num_stages,
            num_micro_batches=num_micro_batches,
        )
        .Set(**kw)
    )


def InputParams(**kw):
    return seq2seq.Seq2SeqInput.Params().Set(
        batch_size=BATCH, vocab_size=VOCAB, min_len=1, max_len=SRC_LEN, **kw
    )


def Batch(**kw):
    """A reverse batch: sources of 1..SRC_LEN symbols, so both sides have padding."""
    batch = next(InputParams(**kw).Instantiate().Batches(1))
    return batch.Transform(tf.convert_to_tensor)


def LossAndGrads(task, batch):
    """(metrics, gradients of the loss for task.trainable_variables)."""
    with tf.GradientTape() as tape:
        metrics = task.FProp(task.theta, batch)
    return metrics, tape.gradient(metrics.loss[0], task.trainable_variables)


def AssertSameModel(got_task, want_task):
    """Same variable names and values: weights come from params and paths alone."""
    got, want = got_task.variables, want_task.variables
    assert [v.name for v in got] == [v.name for v in want]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w.numpy(), err_msg=g.name)


def AssertGradsClose(got, want, rtol=test_utils.RTOL):
    """Relative to the scale of all gradients, as tests/pipeline/gpipe_cells.AssertSame."""
    assert all(g is not None for g in got), "a variable got no gradient"
    scale = max(float(np.max(np.abs(w))) for w in want)
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * scale, err_msg=f"gradient {i}")


@pytest.mark.parametrize(
    "num_stages,num_micro_batches", [(2, 4), pytest.param(4, 4, marks=pytest.mark.extended)]
)
def test_pipelined_equals_unpipelined(num_stages, num_micro_batches):
    kw = dict(label_smoothing=0.1)
    ref = MtParams(**kw).Instantiate()
    task = MtParams(num_stages, num_micro_batches, **kw).Instantiate()
    AssertSameModel(task, ref)
    assert task.pipeline.devices == [f"/device:CPU:{k}" for k in range(num_stages)]
    batch = Batch()
    got, got_grads = tf.function(lambda: LossAndGrads(task, batch), autograph=False)()
    want, want_grads = LossAndGrads(ref, batch)
    np.testing.assert_allclose(got.loss[0], want.loss[0], rtol=test_utils.RTOL)
    np.testing.assert_allclose(got.token_accuracy[0], want.token_accuracy[0])
    np.testing.assert_array_equal(got.loss[1], want.loss[1])
    AssertGradsClose(got_grads, want_grads)


@pytest.mark.extended  # test_gpipe_equivalence's dropout under every remat policy stays
def test_dropout_is_the_same_for_the_same_micro_batches():
    # Masks are drawn per micro-batch, so the reference keeps M and drops the stages.
    kw = dict(dropout_prob=0.2, atten_dropout_prob=0.1)
    ref = MtParams(1, 4, **kw).Instantiate()
    task = MtParams(2, 4, **kw).Instantiate()
    batch = Batch()
    got, got_grads = tf.function(lambda: LossAndGrads(task, batch), autograph=False)()
    want, want_grads = LossAndGrads(ref, batch)
    np.testing.assert_allclose(got.loss[0], want.loss[0], rtol=test_utils.RTOL)
    AssertGradsClose(got_grads, want_grads)
    with base_layer.EvalMode():
        no_dropout = ref.FProp(ref.theta, batch).loss[0]
    assert abs(float(no_dropout) - float(want.loss[0])) > 1e-3, "dropout changed nothing"


def test_loss_and_token_accuracy_against_numpy():
    task = MtParams(2, 2).Instantiate()
    batch = Batch()
    cells = task.pipeline.Cells()
    # The cells one after another on the whole batch; then the loss by hand.
    src, tgt = batch.src, batch.tgt
    state = NestedMap(
        src_ids=src.ids,
        src_paddings=src.paddings,
        tgt_ids=tgt.ids,
        tgt_labels=tgt.labels,
        tgt_paddings=tgt.paddings,
        tgt_weights=tgt.weights,
    )
    for cell in cells[:-1]:
        state = cell.FProp(cell.theta, state)
    logits = cells[-1].Logits(cells[-1].theta, state).numpy()
    labels, weights = batch.tgt.labels.numpy(), batch.tgt.weights.numpy()
    log_probs = logits - np.log(np.sum(np.exp(logits), axis=-1, keepdims=True))
    xent = -np.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
    correct = np.argmax(logits, axis=-1) == labels
    metrics = task.FProp(task.theta, batch)
    np.testing.assert_allclose(metrics.loss[0], np.sum(xent * weights) / np.sum(weights), rtol=1e-5)
    np.testing.assert_allclose(
        metrics.token_accuracy[0], np.sum(correct * weights) / np.sum(weights), rtol=1e-6
    )
    assert float(metrics.loss[1]) == np.sum(weights)
    assert "exact_match" not in metrics  # training mode: no decoding


def test_exact_match_against_hand_counts():
    labels = tf.constant([[3, 4, 2, 0], [3, 4, 2, 0], [4, 2, 0, 0], [0, 0, 0, 0]])
    weights = tf.cast(tf.not_equal(labels, 0), tf.float32)
    # Row 0 matches; row 1 differs before EOS; row 2 differs only after EOS (not
    # counted); row 3 is an empty (all-padding) row that does not count.
    decoded = tf.constant([[3, 4, 2, 0], [3, 5, 2, 0], [4, 2, 7, 7], [5, 5, 5, 5]])
    value, num = mt.ExactMatch(decoded, labels, weights)
    assert float(num) == 3.0
    np.testing.assert_allclose(value, 2.0 / 3.0)
    with pytest.raises(ValueError, match=r"expected decoded.shape == labels.shape"):
        mt.ExactMatch(decoded[:, :3], labels, weights)


def test_greedy_decode_agrees_with_the_pipelined_model():
    """Fed its own decoded prefix, the pipelined model's argmax reproduces each token."""
    task = MtParams(2, 2).Instantiate()
    batch = Batch()
    decoded = task.Decode(task.theta, batch).numpy()
    num_rows, length = decoded.shape
    assert (num_rows, length) == (BATCH, SRC_LEN + 1)
    eos = decoded == task.params.eos_id
    # Up to and including the first EOS; 0s after it.
    before = np.cumsum(eos, axis=1) - eos == 0
    np.testing.assert_array_equal(decoded[~before], 0)
    fed = NestedMap(
        src=batch.src,
        tgt=NestedMap(
            ids=tf.constant(np.concatenate([np.ones([num_rows, 1], np.int32), decoded[:, :-1]], 1)),
            labels=tf.constant(decoded),
            paddings=tf.zeros([num_rows, length]),
            weights=tf.ones([num_rows, length]),
        ),
    )
    with base_layer.EvalMode():
        argmax = task.ComputePredictions(task.theta, fed).argmax.numpy()
    np.testing.assert_array_equal(argmax[before], decoded[before])
    # A longer max_len only extends the decoding.
    longer = task.Decode(task.theta, batch, max_len=length + 2).numpy()
    np.testing.assert_array_equal(longer[:, :length], decoded)


def test_eval_step_reports_exact_match():
    task = MtParams(2, 2).Instantiate()
    batch = Batch()
    metrics = task.EvalStep(batch)
    decoded = task.Decode(task.theta, batch)
    want = mt.ExactMatch(decoded, batch.tgt.labels, batch.tgt.weights)
    np.testing.assert_allclose(metrics.exact_match, want)
    assert "exact_match" not in MtParams(eval_exact_match=False).Instantiate().EvalStep(batch)


def test_fprop_meta_counts_the_built_variables():
    p = MtParams(2, 2, partition="params")
    p.input = InputParams()
    pipe_p = mt.TransformerEncDec.PipelineParams(p)
    with test_utils.CountVariables() as counter:
        metas = costs.CellMetas(pipe_p, pipe_p.cell_tpl, tuple(pipe_p.input_shapes))
        meta = gpipe.PipeliningLayer.FPropMeta(pipe_p, *pipe_p.input_shapes)
    assert counter.count == 0
    out = meta.out_shapes[0]
    assert {k: v.as_list() for k, v in out.items()} == {
        k: [BATCH, SRC_LEN + 1] for k in ("xent", "weights", "argmax")
    }
    task = p.Instantiate()
    cells = task.pipeline.Cells()
    assert [m.num_params for m in metas] == [
        sum(v.shape.num_elements() for v in c.variables) for c in cells
    ]
    assert meta.num_params == sum(v.shape.num_elements() for v in task.variables)
    assert all(m.flops > 0 for m in metas)


def test_errors():
    with pytest.raises(
        ValueError,
        match=r"mt: expected model_dims to be divisible by num_heads, received "
        r"model_dims=10, num_heads=4",
    ):
        MtParams(model_dims=10, num_heads=4).Instantiate()
    p = MtParams()
    p.input = InputParams().Set(vocab_size=16)
    with pytest.raises(
        ValueError,
        match=r"mt: vocab_size=12 is smaller than the input's vocab_size=16; ids up to 15",
    ):
        p.Instantiate()
    with pytest.raises(ValueError, match=r"mt: expected 0 <= eos_id < vocab_size, received "):
        MtParams(eos_id=12).Instantiate()
    with pytest.raises(ValueError, match=r"expected num_encoder_layers to be a positive integer"):
        MtParams(num_encoder_layers=0).Instantiate()
    task = MtParams().Instantiate()
    with pytest.raises(ValueError, match=r"mt: expected max_len to be a positive integer"):
        task.Decode(task.theta, Batch(), max_len=0)


def RunOneTrainStep(p):
    """One eager TrainStep: finite loss, and a gradient for every trainable variable."""
    task = p.Instantiate()
    batch = next(p.input.Instantiate().Batches(1)).Transform(tf.convert_to_tensor)
    _, grads = LossAndGrads(task, batch)
    missing = [v.name for v, g in zip(task.trainable_variables, grads) if g is None]
    assert not missing, f"no gradient for {missing}"
    task.CreateOptimizer()
    metrics = task.TrainStep(batch, 0)
    assert np.isfinite(metrics.loss[0].numpy()) and np.isfinite(metrics.grad_norm[0].numpy())


def test_registered_models():
    keys = model_registry.ListKeys("mt")
    assert keys == ["mt.TransformerEncDecGPipe", "mt.TransformerEncDecTiny"]
    for key in keys:
        for dataset in ("Train", "Dev", "Test"):
            p = model_registry.GetParams(key, dataset)
            assert p.input.split == dataset.lower()
            assert p.input.vocab_size <= p.vocab_size
    RunOneTrainStep(model_registry.GetParams("mt.TransformerEncDecTiny", "Train"))

    # The large config: its size from FPropMeta without building it, then one step
    # of the same recipe (stages, partition, optimizer, smoothing) at toy sizes.
    p = model_registry.GetParams("mt.TransformerEncDecGPipe", "Train")
    assert (p.model_dims, p.hidden_dims, p.num_heads, p.num_stages) == (1024, 16384, 32, 16)
    pipe_p = mt.TransformerEncDec.PipelineParams(p)
    assert len(pipe_p.cell_tpl) == 131
    meta = gpipe.PipeliningLayer.FPropMeta(pipe_p, *pipe_p.input_shapes)
    assert 5.2e9 < meta.num_params < 5.4e9
    p.Set(model_dims=16, hidden_dims=32, num_heads=2, vocab_size=50)
    p.Set(num_encoder_layers=2, num_decoder_layers=3, num_stages=4, num_micro_batches=4)
    p.input.Set(vocab_size=50, batch_size=8, min_len=2, max_len=6)
    RunOneTrainStep(p)


@pytest.mark.slow
@pytest.mark.extended  # test_lm's tiny model learns in the default run
def test_tiny_learns_to_reverse():
    """TransformerEncDecTiny over 2 stages: greedy exact match on held-out data >= 0.8."""
    start = time.time()
    p = model_registry.GetParams("mt.TransformerEncDecTiny", "Train")
    assert p.num_stages == 2 and p.num_micro_batches >= 2
    task = p.Instantiate()
    task.CreateOptimizer()
    dev_p = model_registry.GetParams("mt.TransformerEncDecTiny", "Dev").input
    dev = [b.Transform(tf.convert_to_tensor) for b in dev_p.Instantiate().Batches(2)]
    train_step = tf.function(task.TrainStep, autograph=False)
    eval_step = tf.function(task.EvalStep, autograph=False)

    def HeldOut():
        metrics = [eval_step(b) for b in dev]
        return (
            float(np.mean([m.loss[0] for m in metrics])),
            float(np.mean([m.exact_match[0] for m in metrics])),
        )

    data = iter(p.input.Instantiate().GetDataset())
    curve = []
    for step in range(p.train.max_steps):
        metrics = train_step(next(data), tf.constant(step))
        if step % 100 == 0 or step == p.train.max_steps - 1:
            dev_loss, exact = HeldOut()
            curve.append((step, float(metrics.loss[0]), dev_loss, exact))
            print(
                f"step {step:4d}  train loss {curve[-1][1]:.4f}  dev loss {dev_loss:.4f}  "
                f"dev exact_match {exact:.3f}  ({time.time() - start:.1f} s)"
            )
    assert curve[0][3] < 0.1, "exact match before training should be near 0"
    assert curve[-1][3] >= 0.8, f"held-out exact match {curve[-1][3]:.3f} < 0.8"
