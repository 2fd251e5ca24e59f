"""What goes wrong while a run runs: the logdir lock, the recorded run state, a non-finite
update, signals, unwritable files, and a whole train-resume-eval cycle on `ram://`.

In-process tests train the small `regression.Regression` model of trainer_params;
one slow test runs real trainer processes (a second trainer on a held logdir,
SIGTERM mid-run, the rerun).
"""

import json
import os
import signal
import socket
import stat
import subprocess
import time

import numpy as np
import pytest
import tensorflow as tf
from absl import logging
from trainer_runs import TIMEOUT_S, Command, Env, RegressionTask, Trainer, Weights

from lingpipe.runners import evaler, rundir, train_loop


def _Trainer(logdir, max_steps, evaluate=None, learning_rate=None, checkpoint_steps=2):
    task = RegressionTask(max_steps, learning_rate)
    intervals = train_loop.Intervals(
        log_steps=0, summary_steps=1, checkpoint_steps=checkpoint_steps
    )
    trainer = train_loop.Trainer(
        [task],
        tf.distribute.get_strategy(),
        task.CreateInputGenerator(),
        logdir,
        intervals,
        evaluate=evaluate,
    )
    return trainer, task


class _Killed(Exception):
    """Stands for a kill between the final checkpoint and the evaluation."""


def test_train_resume_eval_cycle_on_ram_and_a_rerun_completes_the_missing_evaluation():
    logdir = "ram://run_safety/cycle"
    with rundir.LogdirLock(logdir) as lock:
        assert tf.io.gfile.exists(lock.path)

        def Kill(step, bound):
            raise _Killed(step)

        trainer, _ = _Trainer(logdir, 4, evaluate=Kill)
        with pytest.raises(_Killed):
            trainer.Train()
        state = rundir.ReadRunState(logdir)
        assert (state.status, state.step, state.evaluated_step) == ("trained", 4, None)
        assert not tf.io.gfile.exists(f"{logdir}/eval_dev.json")

        # The rerun evaluates the step the killed run trained to, and trains nothing.
        trainer, task = _Trainer(logdir, 4)
        dev = task.params.input.Copy().Set(split="dev").Instantiate()
        dev_evaler = evaler.Evaler([task], tf.distribute.get_strategy(), dev, "Dev", logdir, "r")
        calls = []
        trainer._evaluate = lambda step, bound: (
            calls.append(step) or dev_evaler.Evaluate(step, bound)
        )
        assert trainer.Train() == {}
        assert calls == [4] and trainer.global_step == 4
        with tf.io.gfile.GFile(f"{logdir}/eval_dev.json") as f:
            assert json.load(f)["step"] == 4
        assert rundir.ReadRunState(logdir).evaluated_step == 4

        # A rerun of the finished run does nothing; a longer one resumes from ckpt-4.
        calls.clear()
        trainer, _ = _Trainer(logdir, 4, evaluate=lambda step, bound: calls.append(step))
        assert trainer.Train() == {} and calls == []
        trainer, _ = _Trainer(logdir, 6, evaluate=lambda step, bound: calls.append(step))
        trainer.Train()
        assert calls == [6] and trainer.checkpointer.latest == f"{logdir}/checkpoints/ckpt-6"
        assert tf.io.gfile.glob(f"{logdir}/train/events.out.tfevents.*")
    assert not tf.io.gfile.exists(lock.path)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_a_non_finite_update_is_never_saved(tmp_path):
    logdir = str(tmp_path)
    _Trainer(logdir, 2)[0].Train()
    # 1e39 overflows float32: the loss and gradients of step 3 are finite, the weights
    # after its update are not.
    trainer, _ = _Trainer(logdir, 4, learning_rate=1e39, checkpoint_steps=1)
    with pytest.raises(train_loop.NonFiniteError) as e:
        trainer.Train()
    message = str(e.value)
    assert message.startswith(
        "Step 3: the update made 2 of 2 weights non-finite; the first is "
        "regression/pipeline/cell_0/w:0 (learning rate inf). Training stopped before saving "
        "anything of this step"
    )
    assert f"the last good checkpoint is {logdir}/checkpoints/ckpt-2." in message
    assert tf.train.latest_checkpoint(f"{logdir}/checkpoints").endswith("ckpt-2")
    weights = Weights(f"{logdir}/checkpoints/ckpt-2")
    assert weights and all(np.all(np.isfinite(w)) for w in weights.values())
    state = rundir.ReadRunState(logdir)
    assert state.status == "failed" and state.message == message


def _WriteLock(logdir, **holder):
    tf.io.gfile.makedirs(logdir)
    with tf.io.gfile.GFile(os.path.join(logdir, rundir.LOCK_FILE), "w") as f:
        f.write(json.dumps(holder))


def test_lock_refuses_a_live_holder_and_takes_over_a_gone_one(tmp_path, monkeypatch):
    logdir = str(tmp_path / "run")
    host, now = socket.gethostname(), rundir._Now()
    with rundir.LogdirLock(logdir):
        with pytest.raises(rundir.LogdirLockedError) as e:
            rundir.LogdirLock(logdir).Acquire()
    assert str(e.value).startswith(
        f"--logdir={logdir} is in use by another run: pid {os.getpid()} on host {host}, started "
    )
    warnings = []
    monkeypatch.setattr(logging, "warning", lambda msg, *a: warnings.append(msg % a))
    dead = subprocess.Popen(["true"])
    dead.wait()
    _WriteLock(logdir, host=host, pid=dead.pid, started=now, updated=now)
    with rundir.LogdirLock(logdir):
        pass
    assert f"pid {dead.pid} no longer runs on this host" in warnings[-1]
    # Another host's pid cannot be checked: its lock holds until it goes unconfirmed.
    _WriteLock(logdir, host="elsewhere", pid=1, started=now, updated=now)
    with pytest.raises(rundir.LogdirLockedError, match="pid 1 on host elsewhere"):
        rundir.LogdirLock(logdir).Acquire()
    with rundir.LogdirLock(logdir, stale_after_s=-1):
        pass
    assert "its holder on host elsewhere has not confirmed it for" in warnings[-1]
    assert not os.path.exists(os.path.join(logdir, rundir.LOCK_FILE))


def test_run_files_are_readable_by_others_and_unwritable_ones_say_why(tmp_path):
    rundir.WriteRunState(str(tmp_path), rundir.RunState("running", step=0, max_steps=3))
    mode = stat.S_IMODE(os.stat(tmp_path / rundir.RUN_STATE_FILE).st_mode)
    assert mode & 0o044 == 0o044, oct(mode)
    (tmp_path / "file").write_text("")
    with pytest.raises(rundir.LogdirWriteError, match=rf"cannot write {tmp_path}/file/x.json: "):
        rundir.WriteText(str(tmp_path / "file" / "x.json"), "{}")


def _WaitFor(predicate, proc, what):
    deadline = time.monotonic() + TIMEOUT_S
    while not predicate():
        assert proc.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"no {what} in time"
        time.sleep(0.02)


@pytest.mark.slow
def test_lock_refuses_a_second_trainer_and_sigterm_saves_then_the_rerun_is_bitwise(tmp_path):
    flags = ["--model=regression.Regression", "--max_steps=300", "--checkpoint_interval_steps=100"]
    logdir = tmp_path / "stopped"
    log = tmp_path / "first.log"
    with open(log, "w") as stderr:
        first = subprocess.Popen(
            Command(*flags, f"--logdir={logdir}", "--log_interval_steps=1"),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=Env(),
        )
    try:
        _WaitFor(lambda: "] step 3/300" in log.read_text(), first, "step 3")
        first.send_signal(signal.SIGSTOP)  # Holds the lock mid-run while the second tries.
        params_txt = (logdir / "params.txt").read_text()
        second = Trainer(*flags, f"--logdir={logdir}", "--params_override=train.learning_rate : 1")
        assert second.returncode == 2, second.stderr[-3000:]
        last = second.stderr.strip().splitlines()[-1]
        assert last.startswith(
            f"lingpipe.trainer: error: --logdir={logdir} is in use by another run: pid "
            f"{first.pid} on host {socket.gethostname()}, started "
        ), last
        assert (logdir / "params.txt").read_text() == params_txt
        first.send_signal(signal.SIGTERM)
        first.send_signal(signal.SIGCONT)
        first.wait(timeout=TIMEOUT_S)
    finally:
        if first.poll() is None:
            first.kill()
    stderr = log.read_text()
    assert first.returncode == 3, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    step = int(last.split(" at step ")[1].split(";")[0])
    assert last == (
        f"lingpipe.trainer: Stopped by SIGTERM at step {step}; saved ckpt-{step}; rerun the "
        "same command to resume"
    )
    assert 3 <= step < 300 and "Traceback" not in stderr
    assert tf.train.latest_checkpoint(str(logdir / "checkpoints")).endswith(f"ckpt-{step}")
    assert rundir.ReadRunState(str(logdir)).status == "stopped"
    assert not (logdir / "lingpipe.lock").exists()

    rerun = Trainer(*flags, f"--logdir={logdir}", "--log_interval_steps=100")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"Resumed from {logdir}/checkpoints/ckpt-{step} at step {step}" in rerun.stderr
    # Log lines in a file carry the rate; the closing line gives the evaluation.
    assert " steps/s " in rerun.stderr and " ETA " in rerun.stderr
    assert "Done at step 300: Dev at step 300: loss=" in rerun.stderr
    whole = Trainer(*flags, f"--logdir={tmp_path / 'whole'}", "--mode=train")
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert "Done at step 300: no evaluation;" in whole.stderr
    a = Weights(str(tmp_path / "whole" / "checkpoints" / "ckpt-300"))
    b = Weights(str(logdir / "checkpoints" / "ckpt-300"))
    assert a.keys() == b.keys() and a
    for name in a:
        np.testing.assert_array_equal(b[name], a[name], err_msg=name)
