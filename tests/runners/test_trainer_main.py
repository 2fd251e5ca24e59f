"""The trainer's main, run in this process (test_trainer.py runs it in subprocesses).

It builds and checks everything before it writes anything: bad input ends with exit
status 2 and one line naming the value received and what was expected, and the
logdir is left as it was. A URL logdir is written through tf.io.gfile only.
"""

import os

import pytest
import tensorflow as tf

from lingpipe import model_registry, trainer
from lingpipe.runners import checkpointer

KEY = "lm.TransformerLmTiny"


def Main(capsys, *flags):
    """Runs the trainer's main with `flags`; returns (exit status, stderr lines)."""
    capsys.readouterr()
    trainer.FLAGS.unparse_flags()
    trainer.FLAGS(["trainer", f"--model={KEY}", "--logical_devices=8", "--max_steps=2", *flags])
    try:
        status = trainer.main(["trainer"])
    finally:
        trainer.FLAGS.unparse_flags()
    return status, capsys.readouterr().err.strip().splitlines()


def Listing(path):
    """The files under `path` with their contents (None if `path` does not exist)."""
    if not os.path.exists(path):
        return None
    out = {}
    for directory, _, files in os.walk(path):
        for name in files:
            full = os.path.join(directory, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = f.read()
    return out


def _AssertRefused(status, lines, message):
    assert status == 2, lines
    errors = [line for line in lines if line.startswith("lingpipe.trainer: error: ")]
    assert errors == [lines[-1]], lines
    assert message in lines[-1], lines[-1]
    assert not any("Traceback" in line for line in lines)


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--num_micro_batches=64"],
            "num_micro_batches=64: expected at most the 32 examples of a replica's batch "
            "(input.batch_size=32 over 1 replica(s))",
        ),
        (
            ["--params_override=input.batch_size : 0"],
            "expected batch_size to be a positive integer, received batch_size=0",
        ),
        (
            ["--params_override=input.seq_len : 128"],
            "the Train input's batches (ids: [32, 128], labels: [32, 128], paddings: [32, 128], "
            "weights: [32, 128] per replica) do not fit the model: pipeline: F s0 mb0 on "
            "device 0 (/device:CPU:0) failed: ValueError: lm/pipeline/cell_0: expected "
            "sequences of at most max_len=64 tokens, received ids.shape=[16, 128]",
        ),
        (["--mode=eval"], "--mode=eval: no checkpoint in"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(capsys, tmp_path, flags, message):
    logdir = tmp_path / "run"
    status, lines = Main(capsys, f"--logdir={logdir}", *flags)
    _AssertRefused(status, lines, message)
    assert not logdir.exists()


def test_an_unreadable_schedule_file_is_refused_naming_the_flag(capsys, tmp_path):
    path = tmp_path / "binary.csv"
    path.write_bytes(bytes(range(256)))  # Python's own words were only: 'utf-8' codec ...
    status, lines = Main(capsys, f"--logdir={tmp_path / 'run'}", f"--schedule={path}")
    _AssertRefused(
        status,
        lines,
        f"lingpipe.trainer: error: --schedule={path}: not UTF-8 text (byte 0x80 at offset "
        "128); expected a schedule CSV file (UTF-8 text, a row per device of cells such as 0F0)",
    )
    assert not (tmp_path / "run").exists()


def test_a_checkpoint_of_another_model_is_refused_saying_what_changed(capsys, tmp_path):
    logdir = tmp_path / "run"
    ckpt_dir = str(logdir / "checkpoints")
    task = model_registry.GetParams(KEY, "Train").Instantiate()
    step = tf.Variable(1, dtype=tf.int64)
    checkpointer.Checkpointer(ckpt_dir, task=task, global_step=step).Save(1)
    (logdir / "params.txt").write_text("model_dims : 64\n")
    before = Listing(logdir)
    for mode in ("train", "eval"):
        status, lines = Main(
            capsys, f"--logdir={logdir}", f"--mode={mode}", "--params_override=model_dims : 128"
        )
        _AssertRefused(
            status,
            lines,
            f"the checkpoint {ckpt_dir}/ckpt-1 was written by a different model: "
            "task/pipeline/cell_0/emb/emb has shape [259, 64] there and [259, 128] here",
        )
        assert f"use another --logdir or the checkpoint's params ({logdir}/params.txt)" in lines[-1]
        assert Listing(logdir) == before


def test_a_url_logdir_trains_evaluates_and_resumes_without_touching_the_local_disk(
    capsys, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    logdir = "ram://lingpipe_test_trainer_main/run"  # TensorFlow's in-memory file system
    try:
        status, lines = Main(capsys, f"--logdir={logdir}", "--checkpoint_interval_steps=1")
        assert status == 0, lines
        status, lines = Main(capsys, f"--logdir={logdir}", "--mode=eval")
        assert status == 0, lines
        written = {"checkpoints", "eval_dev.json", "eval_test.json", "params.txt", "train"}
        assert written <= set(tf.io.gfile.listdir(logdir))
        assert tf.train.latest_checkpoint(f"{logdir}/checkpoints").endswith("ckpt-2")
        assert os.listdir(tmp_path) == []
    finally:
        if tf.io.gfile.exists(logdir):
            tf.io.gfile.rmtree(logdir)
