"""Export: a SavedModel of lm.TransformerLmTiny that a process with only TensorFlow
loads: its serving signature answers any batch from ids alone with the in-process
model's logits, its eval signature gives the model's outputs and metrics."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from lingpipe import base_layer, export, model_registry

LOAD_WITHOUT_LINGPIPE = textwrap.dedent(
    """
    import sys
    import numpy as np
    import tensorflow as tf
    batch = dict(np.load(sys.argv[1]))
    out = {}
    for name in sys.argv[3:]:
        serve = tf.saved_model.load(name).signatures["eval"]
        got = serve(**{k: tf.constant(v) for k, v in batch.items()})
        out.update({name.rsplit("/", 1)[-1] + "." + k: v.numpy() for k, v in got.items()})
    assert "lingpipe" not in sys.modules, "the loader imported lingpipe"
    np.savez(sys.argv[2], **out)
    """
)


@pytest.fixture(scope="module")
def task():
    p = model_registry.GetParams("lm.TransformerLmTiny", "Dev")
    p.input.batch_size = 8
    return p.Instantiate()


def test_saved_model_runs_without_lingpipe_and_matches_the_model(task, tmp_path):
    pipelined = export.Export(task, str(tmp_path / "pipelined"))
    single = export.Export(task, str(tmp_path / "single"), single_device=True)
    batch = next(iter(task.CreateInputGenerator().GetDataset()))
    np.savez(tmp_path / "batch.npz", **{k: v.numpy() for k, v in batch.items()})
    with base_layer.EvalMode():
        want = task.ComputePredictions(task.theta, batch)
        want.update({k: v for k, (v, _) in task.ComputeLoss(task.theta, want, batch).items()})

    subprocess.run(
        [sys.executable, "-c", LOAD_WITHOUT_LINGPIPE, str(tmp_path / "batch.npz")]
        + [str(tmp_path / "out.npz"), pipelined, single],
        check=True,
        timeout=300,
    )
    got = np.load(tmp_path / "out.npz")
    for where in ("pipelined", "single"):
        assert {k.split(".", 1)[1] for k in got if k.startswith(where)} == set(want)
        for name, value in want.items():
            np.testing.assert_allclose(
                got[f"{where}.{name}"], value, rtol=1e-6, atol=1e-6, err_msg=f"{where} {name}"
            )


SERVE_WITHOUT_LINGPIPE = textwrap.dedent(
    """
    import sys
    import numpy as np
    import tensorflow as tf
    ids = dict(np.load(sys.argv[1]))
    out = {}
    for name in sys.argv[3:]:
        serve = tf.saved_model.load(name).signatures["serving_default"]
        assert [k for k in serve.structured_input_signature[1]] == ["ids"]
        for key, batch in ids.items():
            got = serve(ids=tf.constant(batch))
            out.update({f"{name.rsplit('/', 1)[-1]}.{key}.{k}": v.numpy() for k, v in got.items()})
    assert "lingpipe" not in sys.modules, "the loader imported lingpipe"
    np.savez(sys.argv[2], **out)
    """
)


def test_served_model_answers_any_batch_from_ids_alone(task, tmp_path):
    pipelined = export.Export(task, str(tmp_path / "pipelined"))
    single = export.Export(task, str(tmp_path / "single"), single_device=True)
    rng = np.random.default_rng(0)
    # Batches of 3 and 5, and 1: fewer rows than the pipeline's micro-batches (2).
    ids = {f"b{b}": rng.integers(3, 259, size=(b, 16), dtype=np.int32) for b in (3, 5, 1)}
    ids["b5"][1, 10:] = 0  # a shorter sequence, padded with PAD_ID
    np.savez(tmp_path / "ids.npz", **ids)
    subprocess.run(
        [sys.executable, "-c", SERVE_WITHOUT_LINGPIPE, str(tmp_path / "ids.npz")]
        + [str(tmp_path / "served.npz"), pipelined, single],
        check=True,
        timeout=300,
    )
    got = np.load(tmp_path / "served.npz")
    for key, batch in ids.items():
        with base_layer.EvalMode():
            want = task.Serve(task.theta, tf.constant(batch))
        assert want["logits"].shape == (len(batch), 16, 259)
        for where in ("pipelined", "single"):
            for name in ("logits", "predictions"):
                np.testing.assert_allclose(
                    got[f"{where}.{key}.{name}"], want[name], rtol=1e-5, atol=1e-5, err_msg=where
                )


def test_single_device_export_needs_a_pipelined_task(tmp_path):
    from lingpipe.models import base_task

    class NotPipelined(base_task.BaseTask):
        pass

    p = NotPipelined.Params().Set(name="plain")
    p.input = model_registry.GetParams("lm.TransformerLmTiny", "Dev").input
    with pytest.raises(ValueError, match="plain: single_device=True needs a pipelined task"):
        export.Export(p.Instantiate(), str(tmp_path / "x"), single_device=True)


def test_trainer_trains_through_float16_overflow_and_exports(tmp_path, capsys):
    from lingpipe import trainer

    def Main(*flags):
        trainer.FLAGS.unparse_flags()
        trainer.FLAGS(["trainer", "--model=lm.TransformerLmTiny", "--logical_devices=8", *flags])
        try:
            return trainer.main(["trainer"])
        finally:
            trainer.FLAGS.unparse_flags()

    logdir = str(tmp_path / "run")
    # A loss scale that overflows float16 in the first steps: each is skipped and the
    # scale halves until the steps apply; the run ends normally with finite checkpoints.
    # (A run in which no step applies fails: test_fault_sweep.)
    overflow = "train.loss_scale.initial_scale : 1e5; input.batch_size : 4"
    status = Main(
        f"--logdir={logdir}",
        "--mode=train",
        "--max_steps=12",
        "--precision=float16",
        f"--params_override={overflow}",
    )
    assert status == 0, capsys.readouterr().err
    path = tf.train.latest_checkpoint(f"{logdir}/checkpoints")
    reader = tf.train.load_checkpoint(path)
    names = [n for n, _ in tf.train.list_variables(path)]
    scale = [n for n in names if "loss_scale/scale" in n]
    assert scale and reader.get_tensor(scale[0]) < np.float32(1e5) / 2  # halved, then kept
    (applied,) = [reader.get_tensor(n) for n in names if "iter" in n]
    assert 0 < applied < 12  # some steps skipped, the later ones applied
    for n in names:
        value = reader.get_tensor(n)
        if np.issubdtype(np.asarray(value).dtype, np.floating):
            assert np.all(np.isfinite(value)), n

    # The checkpoint holds the loss scale: export with the precision it was trained in.
    saved = str(tmp_path / "saved")
    status = Main(
        f"--logdir={logdir}", "--mode=export", "--precision=float16", f"--export_dir={saved}"
    )
    assert status == 0, capsys.readouterr().err
    assert "serving_default" in tf.saved_model.load(saved).signatures
