"""The three model families train to the same losses under every schedule, and a
checkpoint written under one schedule and K restores under another."""

import numpy as np
import pytest
import tensorflow as tf

from lingpipe import model_registry
from lingpipe.pipeline.schedules import generators
from lingpipe.pipeline.step import placement

STEPS = 10  # enough for the losses to part if a schedule computed another step
# (schedule, num_stages, num_virtual_stages): each family's cells allow these cuts.
LAYOUTS = [("1f1b", 2, 1), ("zero_bubble", 2, 1), ("interleaved_1f1b", 2, 2)]
MODELS = {
    "lm.TransformerLmTiny": dict(tie_embeddings=True, dropout_prob=0.1),
    "mt.TransformerEncDecTiny": dict(),
    "image.AmoebaNetDigitsTiny": dict(),
}


def _Params(key, sched, k, v, m=4, **extra):
    p = model_registry.GetParams(key, "Train")
    p.Set(num_stages=k, num_micro_batches=m, schedule=sched, num_virtual_stages=v, **extra)
    p.input.batch_size = 8
    return p


def _Losses(p, steps=STEPS):
    task = p.Instantiate()
    task.CreateOptimizer()
    data = iter(task.CreateInputGenerator().GetDataset())
    step = tf.function(task.TrainStep, autograph=False)
    return task, [float(step(next(data), tf.constant(i)).loss[0]) for i in range(steps)]


@pytest.mark.slow
@pytest.mark.extended  # tests/pipeline/test_executor.py runs every schedule against gpipe
@pytest.mark.parametrize("key", sorted(MODELS))
def test_every_schedule_trains_to_the_losses_of_gpipe(key):
    # Tracing dominates (about 12 s per schedule for AmoebaNet); each step after it
    # takes milliseconds. As few micro-batches as interleaving allows (M = K) for the
    # convolutional and encoder-decoder models, whose traces are the largest.
    m = 4 if key.startswith("lm.") else 2
    # AmoebaNet's losses under the interleaved placement (four chunks, the micro-batches'
    # gradients added in another order) equal GPipe's to 6 digits after one update; the
    # sums' rounding then grows about tenfold a step in this small batch-normalized
    # convnet (2e-6 after two updates, 1e-4 after four, 5e-3 after nine), so it is
    # compared over its first 4 steps. A step computed otherwise parts at the first.
    steps = 4 if key.startswith("image.") else STEPS
    _, want = _Losses(_Params(key, "gpipe", 2, 1, m, **MODELS[key]), steps)
    # The LM runs every layout; the encoder-decoder and AmoebaNet, whose traces are the
    # longest, the split backward (zero bubble) and the interleaved loop placement
    # respectively (1F1B's order is zero bubble's with whole backwards).
    layouts = {"lm": LAYOUTS, "mt": LAYOUTS[1:2], "image": LAYOUTS[2:]}[key.split(".")[0]]
    for sched, k, v in layouts:
        _, got = _Losses(_Params(key, sched, k, v, m, **MODELS[key]), steps)
        np.testing.assert_allclose(got, want, rtol=1e-4, err_msg=f"{key} under {sched}")


def test_a_checkpoint_of_one_schedule_and_k_restores_under_another(tmp_path):
    key = "lm.TransformerLmTiny"
    task, _ = _Losses(_Params(key, "gpipe", 2, 1), steps=2)
    path = tf.train.Checkpoint(task=task).write(str(tmp_path / "ckpt"))
    other = _Params(key, "interleaved_1f1b", 2, 2).Instantiate()
    other.CreateOptimizer()
    tf.train.Checkpoint(task=other).read(path).assert_existing_objects_matched()
    for a, b in zip(task.trainable_variables, other.trainable_variables):
        assert a.name == b.name
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert {v.device[-5:] for v in other.trainable_variables} == {"CPU:0", "CPU:1"}
    # The restored weights give the same evaluation.
    batch = next(iter(task.CreateInputGenerator().GetDataset()))
    np.testing.assert_allclose(
        other.EvalStep(batch).loss[0], task.EvalStep(batch).loss[0], rtol=1e-5
    )


class _Recorder:
    def __init__(self):
        self.cores = set()

    def __call__(self, tensor, core):
        out = tf.identity(tensor)  # made where the annotation is made
        self.cores.add((core, out.op.device[-1:]))
        return out


# GPipe's annotations are tested on their own (tests/pipeline/test_gpipe_placement_tpu.py);
# 1F1B's order is zero bubble's with B unsplit: both extended.
@pytest.mark.parametrize(
    "sched",
    [pytest.param(s, marks=pytest.mark.extended) if s in ("gpipe", "1f1b") else s
     for s in generators.SCHEDULES[:4]],
)  # fmt: skip
def test_tpu_core_annotation_under_every_schedule(sched):
    v = 2 if sched == "interleaved_1f1b" else 1
    task = _Params("lm.TransformerLmTiny", sched, 2, v).Instantiate()
    batch = next(iter(task.CreateInputGenerator().GetDataset()))
    recorder = _Recorder()

    @tf.function(autograph=False)
    def Step():
        with placement.LogicalCores(recorder, task.pipeline.devices):
            return task.ComputeGradients(batch, 0)

    metrics, grads = Step()
    assert np.isfinite(metrics.loss[0].numpy())
    # Every annotation for core k is made in stage k's device scope (CPU:k).
    assert {core for core, _ in recorder.cores} == {0, 1}
    assert all(str(core) == device for core, device in recorder.cores), recorder.cores
