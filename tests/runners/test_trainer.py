"""The trainer binary end to end, in subprocesses: train, eval, resume, failures, bad input."""

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest
import tensorflow as tf
from trainer_runs import LM, TIMEOUT_S, Command, Env, Trainer, Weights


def Events(directory):
    """{tag: {step: value}} of the scalar summaries of the event files in `directory`."""
    out = {}
    files = glob.glob(os.path.join(directory, "events.out.tfevents.*"))
    assert files, f"no event files in {directory}"
    for path in files:
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tensor.dtype == tf.string.as_datatype_enum:
                    continue  # the params text summary
                scalar = float(tf.make_ndarray(value.tensor))
                out.setdefault(value.tag, {})[event.step] = scalar
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A TransformerLmTiny run of 40 steps, pipelined over 2 logical CPU devices."""
    logdir = str(tmp_path_factory.mktemp("runs") / "lm")
    run = Trainer(
        LM,
        f"--logdir={logdir}",
        "--max_steps=40",
        "--summary_interval_steps=5",
        "--checkpoint_interval_steps=20",
        "--log_interval_steps=10",
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return logdir, run


def test_train_and_eval_writes_params_checkpoints_summaries_and_eval(trained):
    logdir, run = trained
    # Pipelined over two devices, as the partition report at start-up says.
    assert "/device:CPU:0" in run.stderr and "/device:CPU:1" in run.stderr
    params_text = open(os.path.join(logdir, "params.txt")).read()
    assert "train.max_steps : 40" in params_text and "num_stages : 2" in params_text
    diff = open(os.path.join(logdir, "params_diff.txt")).read()
    assert "> train.max_steps : 40" in diff and "< train.max_steps : 400" in diff
    ckpts = tf.train.get_checkpoint_state(os.path.join(logdir, "checkpoints"))
    assert [os.path.basename(p) for p in ckpts.all_model_checkpoint_paths] == [
        "ckpt-20",
        "ckpt-40",
    ]
    weights = Weights(ckpts.model_checkpoint_path)
    assert (
        len(weights) == 37 and "task/pipeline/cell_0/emb/emb/.ATTRIBUTES/VARIABLE_VALUE" in weights
    )
    assert all(np.all(np.isfinite(w)) for w in weights.values())
    train = Events(os.path.join(logdir, "train"))
    for tag in ("loss", "learning_rate", "grad_norm", "steps_per_sec", "examples_per_sec"):
        assert sorted(train[tag]) == list(range(5, 45, 5)), tag
    assert train["loss"][40] < train["loss"][5] - 1.0  # from ~5 nats/byte down
    np.testing.assert_allclose(
        train["examples_per_sec"][40] / train["steps_per_sec"][40], 32, rtol=1e-5
    )
    for dataset in ("dev", "test"):
        result = json.load(open(os.path.join(logdir, f"eval_{dataset}.json")))
        assert result["step"] == 40 and result["model"] == "lm.TransformerLmTiny"
        assert result["metrics"]["loss"] < train["loss"][5]
        events = Events(os.path.join(logdir, f"eval_{dataset}"))
        np.testing.assert_allclose(events["loss"][40], result["metrics"]["loss"], rtol=1e-6)


def test_eval_mode_evaluates_the_latest_checkpoint(trained, tmp_path):
    logdir = str(tmp_path / "copy")
    shutil.copytree(trained[0], logdir)
    before = json.load(open(os.path.join(logdir, "eval_dev.json")))
    os.remove(os.path.join(logdir, "eval_dev.json"))
    run = Trainer(LM, f"--logdir={logdir}", "--mode=eval", "--max_steps=40")
    assert run.returncode == 0, run.stderr[-3000:]
    after = json.load(open(os.path.join(logdir, "eval_dev.json")))
    assert after["step"] == 40
    np.testing.assert_allclose(after["metrics"]["loss"], before["metrics"]["loss"], rtol=1e-5)


def test_corrupted_latest_checkpoint_falls_back_to_the_previous(trained, tmp_path):
    logdir = str(tmp_path / "copy")
    shutil.copytree(trained[0], logdir)
    ckpt_dir = os.path.join(logdir, "checkpoints")
    with open(os.path.join(ckpt_dir, "ckpt-40.data-00000-of-00001"), "wb") as f:
        f.write(b"not a checkpoint")
    run = Trainer(LM, f"--logdir={logdir}", "--max_steps=45", "--mode=train")
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"Checkpoint {ckpt_dir}/ckpt-40 cannot be read" in run.stderr
    assert f"falling back to the one before it, {ckpt_dir}/ckpt-20" in run.stderr
    assert f"Resumed from {ckpt_dir}/ckpt-20 at step 20" in run.stderr
    assert tf.train.latest_checkpoint(ckpt_dir).endswith("ckpt-45")


def _LoggedSteps(stderr):
    return [
        int(line.split("step ")[1].split("/")[0])
        for line in stderr.splitlines()
        if "] step " in line
    ]


@pytest.mark.slow
def test_resume_after_sigkill_ends_with_the_weights_of_an_uninterrupted_run(trained, tmp_path):
    # The uninterrupted run is the module's 40 steps (how often it logs, writes summaries
    # and checkpoints changes no weight).
    flags = [LM, "--max_steps=40", "--checkpoint_interval_steps=10", "--log_interval_steps=1"]

    logdir = tmp_path / "killed"
    ckpt_dir = logdir / "checkpoints"
    proc = subprocess.Popen(
        Command(*flags, f"--logdir={logdir}", "--mode=train"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=Env(),
    )
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not (ckpt_dir / "ckpt-20.index").exists():
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "no checkpoint appeared in time"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    listed = tf.train.latest_checkpoint(str(ckpt_dir))
    # The kill may fall between a checkpoint's files and the state file naming it: the
    # rerun resumes from the newest checkpoint whose files are there, and says so.
    resumed_at = max(int(p.name[len("ckpt-") : -len(".index")]) for p in ckpt_dir.glob("*.index"))
    assert 20 <= resumed_at < 40 and listed is not None, (resumed_at, listed)
    newest = str(ckpt_dir / f"ckpt-{resumed_at}")

    rerun = Trainer(*flags, f"--logdir={logdir}", "--mode=train")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"Resumed from {newest} at step {resumed_at}" in rerun.stderr
    recovered = f"the newest checkpoint {newest} is not in checkpoint (a run killed while saving)"
    assert (recovered in rerun.stderr) == (listed != newest), (listed, rerun.stderr[-3000:])
    # No step already checkpointed is trained again.
    assert _LoggedSteps(rerun.stderr) == list(range(resumed_at + 1, 41))
    a = Weights(os.path.join(trained[0], "checkpoints", "ckpt-40"))
    b = Weights(str(ckpt_dir / "ckpt-40"))
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-6, atol=1e-7, err_msg=name)


def test_logdir_that_is_a_file(tmp_path):
    # The binary exits with main's status: test_trainer_main.py runs main's other refusals.
    path = tmp_path / "a_file"
    path.write_text("keep me")
    run = Trainer(LM, f"--logdir={path}", timeout=60)
    assert run.returncode == 2
    assert f"--logdir={path}: {path} is a file; expected a directory" in run.stderr
    assert path.read_text() == "keep me"


def test_help_explains_every_flag():
    run = Trainer("--help", timeout=60)  # absl exits with status 1 after --help.
    for flag in (
        "model",
        "logdir",
        "mode",
        "params_override",
        "params_file",
        "max_steps",
        "num_stages",
        "num_micro_batches",
        "strategy",
        "tpu",
        "logical_devices",
        "seed",
        "log_interval_steps",
        "summary_interval_steps",
        "checkpoint_interval_steps",
        "eval_interval_steps",
    ):
        assert re.search(rf"--{flag}: [<\w]", run.stdout), flag


@pytest.mark.slow
def test_mirrored_replicas_of_pipelines_train_as_the_default_run_and_restore_anywhere(
    trained, tmp_path
):
    default_logdir, _ = trained
    logdir = str(tmp_path / "mirrored")
    run = Trainer(
        LM,
        f"--logdir={logdir}",
        "--strategy=mirrored",
        "--logical_devices=8",
        "--num_stages=4",
        "--max_steps=40",
        "--summary_interval_steps=5",
        "--checkpoint_interval_steps=20",
        "--mode=train",
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "strategy=mirrored: 2 replica(s) of 4 stage(s)" in run.stderr
    assert "replica 1: stage 0 on /device:CPU:4, stage 1 on /device:CPU:5" in run.stderr
    assert "global batch 32 = 2 replica(s) x 16; each replica pipelines 2 micro-batches of 8" in (
        run.stderr
    )
    # 2 replicas x 4 stages train as 1 replica x 2 stages on the same global batches.
    got = Events(os.path.join(logdir, "train"))["loss"]
    want = Events(os.path.join(default_logdir, "train"))["loss"]
    assert sorted(got) == sorted(want)
    for step in want:
        np.testing.assert_allclose(got[step], want[step], rtol=1e-4, err_msg=str(step))
    # Its checkpoint restores into another layout: one replica of 2 stages.
    evaluated = Trainer(LM, f"--logdir={logdir}", "--mode=eval", "--max_steps=40")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    mirrored = json.load(open(os.path.join(logdir, "eval_dev.json")))
    default = json.load(open(os.path.join(default_logdir, "eval_dev.json")))
    np.testing.assert_allclose(mirrored["metrics"]["loss"], default["metrics"]["loss"], rtol=1e-4)
