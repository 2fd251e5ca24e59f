"""The trainer's main, run in this process (test_trainer.py runs the binary in subprocesses).

It builds and checks everything before it writes anything: bad input ends with exit
status 2 and one line naming the value received and what was expected, and the
logdir is left as it was. A URL logdir is written through tf.io.gfile only.
"""

import os
import re

import numpy as np
import pytest
import tensorflow as tf
from trainer_runs import (
    KEY,
    AssertRefused,
    FreePorts,
    Listing,
    Main,
    MainWithOutput,
    Weights,
    WithTrainerParams,
)

from lingpipe import model_registry
from lingpipe.runners import checkpointer


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
    AssertRefused(status, lines, message)
    assert not logdir.exists()


# test_trainer.py's test_logdir_that_is_a_file shows the binary exits with main's status 2.
@pytest.mark.parametrize(
    "flags, message",
    [
        (["--model=lm.TransformerLmTinyy"], r"Unknown model 'lm.TransformerLmTinyy'. Did you mean"),
        (
            ["--params_override=model_dims : __import__('os').system('touch /tmp/pwned')"],
            r"value for 'model_dims' is not a literal",
        ),
        (["--logical_devices=65"], r"--logical_devices=65: .*expected an integer in \[1, 64\]"),
        (
            ["--strategy=tpu", "--tpu=no-such-tpu"],
            r"--strategy=tpu --tpu=no-such-tpu: .*no TPU could be reached for "
            r"tpu_name='no-such-tpu'",
        ),
        (
            ["--strategy=multi_worker"],
            r"reads the cluster from the TF_CONFIG environment variable, which is not set",
        ),
        (
            ["--strategy=mirrored", "--num_stages=2", "--params_override=input.batch_size : 30"],
            r"the global batch of 30 examples cannot be split evenly over 4 replicas; set "
            r"input.batch_size to a multiple of 4",
        ),
    ],
)
def test_bad_flags_exit_2_with_a_clear_message_and_write_nothing(
    capsys, tmp_path, monkeypatch, flags, message
):
    # No cluster or TPU named in the environment; a GCE metadata server that refuses at once.
    for name in ("TF_CONFIG", "TPU_NAME", "TPU_CONFIG", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("GCE_METADATA_IP", raising=False)
    (closed,) = FreePorts(1)  # nothing listens there
    monkeypatch.setenv("GCE_METADATA_HOST", f"127.0.0.1:{closed}")
    monkeypatch.setenv("no_proxy", "*")
    monkeypatch.setenv("NO_PROXY", "*")
    logdir = tmp_path / "never"
    status, lines = Main(capsys, f"--logdir={logdir}", *flags)
    assert status == 2, lines
    assert lines[-1].startswith("lingpipe.trainer: error: "), lines
    assert re.search(message, lines[-1]), lines[-1]
    assert not any("Traceback" in line for line in lines)
    assert not logdir.exists()


def test_positional_arguments_exit_2_naming_them(capsys, tmp_path):
    logdir = tmp_path / "never"
    status, lines = Main(capsys, f"--logdir={logdir}", argv=("trainer", "positional"))
    AssertRefused(status, lines, "unexpected arguments ['positional']")
    assert not logdir.exists()


def test_an_unreadable_schedule_file_is_refused_naming_the_flag(capsys, tmp_path):
    path = tmp_path / "binary.csv"
    path.write_bytes(bytes(range(256)))  # Python's own words were only: 'utf-8' codec ...
    status, lines = Main(capsys, f"--logdir={tmp_path / 'run'}", f"--schedule={path}")
    AssertRefused(
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
        AssertRefused(
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


def test_nan_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(capsys, tmp_path):
    WithTrainerParams()
    logdir = tmp_path / "nan"
    status, lines = Main(
        capsys,
        "--model=regression.PoisonedRegression",
        "--max_steps=20",  # the model's own: the loss turns nan at step 6
        f"--logdir={logdir}",
        "--checkpoint_interval_steps=2",
        "--mode=train",
    )
    assert status == 1, lines
    message = lines[-1]
    assert message.startswith("lingpipe.trainer: error: Step 6: the loss is nan"), message
    assert "the first is that of regression/pipeline/cell_0/w:0" in message
    assert f"the last good checkpoint is {logdir}/checkpoints/ckpt-4" in message
    ckpt_dir = str(logdir / "checkpoints")
    assert tf.train.latest_checkpoint(ckpt_dir).endswith("ckpt-4")
    weights = Weights(tf.train.latest_checkpoint(ckpt_dir))
    assert weights and all(np.all(np.isfinite(w)) for w in weights.values())


def test_inspect_model_prints_the_layer_tree_and_partition_report(capsys):
    status, out, lines = MainWithOutput(capsys, "--mode=inspect_model", "--num_stages=2")
    assert status == 0, lines
    assert "Pipeline lm/pipeline:" in out
    for row in ("0      /device:CPU:0", "1      /device:CPU:1"):
        assert row in out
    assert "GFLOPs" in out and "micro_batches=2" in out
    assert "Total: 133,507 parameters" in out


def test_inspect_params_prints_the_overridden_params(capsys):
    status, out, lines = MainWithOutput(
        capsys, "--mode=inspect_params", "--params_override=model_dims : 32; num_heads : 4"
    )
    assert status == 0, lines
    assert "model_dims : 32\n" in out and "num_heads : 4\n" in out
