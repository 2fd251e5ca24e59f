"""The last failures of issue 21's fault sweep, each reproduced: a stale-lock takeover
race, a hung stage host, signals before the first step, bad params that once got
tracebacks, and weak behaviour (see README, "What a run does when things go wrong");
logdirs named like globs are in test_glob_paths.py."""

import json
import multiprocessing
import os
import re
import socket
import subprocess
import sys

import pytest
from host_workers import DEADLINE_S, CheckpointStep, Chief, Cluster, Read, Workers
from trainer_runs import (
    KEY,
    TIMEOUT_S,
    AssertRefused,
    Command,
    Env,
    LastTrainerLine,
    Listing,
    Main,
    RegressionTask,
    Weights,
)

_TRIALS = 300  # the race hit 2 in 400 and 1 in 60 trials before the fix


def _DeadPid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _Contender(barrier, jobs, results):
    """One of two processes: at each barrier, tries to take the lock of the next logdir."""
    from lingpipe.runners import rundir

    held = []  # kept alive: a winner holds its lock to the end of the test
    while (logdir := jobs.get()) is not None:
        barrier.wait()
        lock = rundir.LogdirLock(logdir, heartbeat_s=0)
        try:
            lock.Acquire()
            held.append(lock)
            results.put((logdir, True))
        except rundir.LogdirLockedError as e:
            results.put((logdir, str(e)))


def test_two_processes_never_both_take_over_a_stale_lock(tmp_path):

    # Forked: the children have rundir imported already, so the trials start at once
    # (spawned ones spent 17 s importing TensorFlow); they only touch local files.
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    jobs = [ctx.Queue(), ctx.Queue()]
    procs = [ctx.Process(target=_Contender, args=(barrier, q, results)) for q in jobs]
    for p in procs:
        p.start()
    dead = _DeadPid()
    holder = {"host": socket.gethostname(), "pid": dead, "started": "", "updated": ""}
    both = []
    try:
        for trial in range(_TRIALS):
            logdir = tmp_path / f"run{trial}"
            logdir.mkdir()
            (logdir / "lingpipe.lock").write_text(json.dumps(holder))
            for q in jobs:
                q.put(str(logdir))
            outcomes = [results.get(timeout=60)[1] for _ in procs]
            won = [o is True for o in outcomes]
            assert any(won), f"trial {trial}: neither process took the stale lock: {outcomes}"
            if all(won):
                both.append(trial)
    finally:
        for q in jobs:
            q.put(None)
        for p in procs:
            p.join(timeout=30)
    assert not both, f"both processes took the lock in {len(both)} of {_TRIALS} trials"


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "fprop_dtype : lingpipe.optimizers.Adam",
            "--params_override: fprop_dtype: expected a floating-point dtype (tf.float32, "
            "tf.bfloat16, tf.float16, tf.float64) or None, received lingpipe.optimizers.Adam",
        ),
        (
            "dtype : tf.string",
            "--params_override: dtype: expected a floating-point dtype (tf.float32, "
            "tf.bfloat16, tf.float16, tf.float64) or None, received tf.string",
        ),
        (
            "train.lr_schedule.cls : lingpipe.lr_schedules.BaseSchedule",
            "--params_override: train.lr_schedule.cls: expected a class that defines "
            "_Value (a subclass of lingpipe.lr_schedules.BaseSchedule), received "
            "lingpipe.lr_schedules.BaseSchedule, which does not",
        ),
        (
            "train.optimizer.cls : lingpipe.optimizers.BaseOptimizer",
            "--params_override: train.optimizer.cls: expected a class that defines "
            "_CreateKerasOptimizer (a subclass of lingpipe.optimizers.BaseOptimizer), "
            "received lingpipe.optimizers.BaseOptimizer, which does not",
        ),
        (
            "random_seed : 1.5",
            "--params_override: random_seed: expected an integer >= 0 or None, received 1.5",
        ),
    ],
)
def test_bad_param_values_are_refused_in_one_line_before_anything_is_written(
    capsys, tmp_path, override, message
):
    logdir = tmp_path / "run"
    status, lines = Main(capsys, f"--logdir={logdir}", f"--params_override={override}")
    AssertRefused(status, lines, message)
    assert lines[-1] == f"lingpipe.trainer: error: {message}"
    assert not logdir.exists()


def test_a_params_file_that_is_a_directory_is_refused_before_anything_is_written(capsys, tmp_path):
    logdir = tmp_path / "run"
    (logdir / "params.txt").mkdir(parents=True)
    before = Listing(logdir)
    status, lines = Main(capsys, f"--logdir={logdir}")
    message = (
        f"--logdir={logdir}: {logdir}/params.txt is a directory; expected a file the run "
        "writes (move it away or choose another --logdir)"
    )
    AssertRefused(status, lines, message)
    assert Listing(logdir) == before and sorted(os.listdir(logdir)) == ["params.txt"]


def test_a_full_disk_at_start_up_ends_with_one_line_exit_1_and_no_lock(
    capsys, tmp_path, monkeypatch
):
    import tensorflow as tf

    logdir = tmp_path / "run"
    real = tf.io.gfile.GFile

    class FullDisk(real):
        """The disk fills up at the first write of the params (the lock fits)."""

        def close(self):
            if "params" in self.name:
                raise tf.errors.ResourceExhaustedError(
                    None, None, f"{self.name}; No space left on device"
                )
            super().close()

    monkeypatch.setattr(tf.io.gfile, "GFile", FullDisk)
    status, lines = Main(capsys, f"--logdir={logdir}")
    assert status == 1, lines
    assert not any("Traceback" in line for line in lines)
    assert lines[-1].startswith(f"lingpipe.trainer: error: cannot write {logdir}/params.txt: ")
    assert lines[-1].endswith("; No space left on device"), lines[-1]
    assert sorted(os.listdir(logdir)) == []  # no lock, no half-written file


@pytest.mark.parametrize("export_dir", ["file/export", "file"])
def test_an_export_dir_under_or_at_a_file_is_refused(capsys, tmp_path, export_dir):
    (tmp_path / "file").write_text("not a directory")
    status, lines = Main(
        capsys,
        f"--logdir={tmp_path / 'run'}",
        "--mode=export",
        f"--export_dir={tmp_path / export_dir}",
    )
    AssertRefused(
        status,
        lines,
        f"--export_dir={tmp_path / export_dir}: {tmp_path / 'file'} is a file; expected a "
        "directory (new, empty, or holding an earlier export)",
    )


def _SaveOneCheckpoint(logdir):
    """ckpt-1 of an untrained TransformerLmTiny in logdir/checkpoints."""
    import tensorflow as tf

    from lingpipe import model_registry
    from lingpipe.runners import checkpointer

    task = model_registry.GetParams(KEY, "Train").Instantiate()
    step = tf.Variable(1, dtype=tf.int64)
    checkpointer.Checkpointer(str(logdir / "checkpoints"), task=task, global_step=step).Save(1)


def test_an_export_beside_other_files_is_refused(capsys, tmp_path):
    logdir = tmp_path / "run"
    _SaveOneCheckpoint(logdir)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    (logdir / "export" / "1").mkdir(parents=True)
    (logdir / "export" / "1" / "a.txt").write_text("the user's")
    before = Listing(tmp_path)
    status, lines = Main(capsys, f"--logdir={logdir}", "--mode=export", f"--export_dir={mine}")
    AssertRefused(
        status,
        lines,
        f"--export_dir={mine}: it holds notes.txt, which an export would sit beside; expected "
        "a directory (new, empty, or holding an earlier export)",
    )
    status, lines = Main(capsys, f"--logdir={logdir}", "--mode=export")
    AssertRefused(
        status,
        lines,
        f"the export directory {logdir}/export/1 (--export_dir's default): it holds a.txt, "
        "which an export would sit beside",
    )
    assert Listing(tmp_path) == before


@pytest.mark.parametrize("min_scale", [1e30, 1.0], ids=["at_min_scale", "scale_still_falling"])
def test_a_float16_run_that_skipped_every_step_fails_instead_of_reporting_done(tmp_path, min_scale):
    import tensorflow as tf

    from lingpipe import model_registry
    from lingpipe.runners import rundir, train_loop

    # A small LM in float16 with a loss scale that overflows and may not go lower.
    p = model_registry.GetParams("lm.TransformerLmTiny", "Train")
    p.Set(model_dims=16, hidden_dims=16, num_layers=1, num_heads=2, fprop_dtype=tf.float16)
    p.input.Set(batch_size=4, seq_len=8)
    p.train.max_steps = 4
    # Halving from 1e30 four times stays far above what float16 holds: every step skips.
    p.train.loss_scale.Set(initial_scale=1e30, min_scale=min_scale)
    task = p.Instantiate()
    task.CreateOptimizer()
    trainer = train_loop.Trainer(
        [task],
        tf.distribute.get_strategy(),
        task.CreateInputGenerator(),
        str(tmp_path / "run"),
        train_loop.Intervals(log_steps=0, summary_steps=1, checkpoint_steps=2),
    )
    with pytest.raises(train_loop.NonFiniteError) as e:
        trainer.Train()
    scale = "1e+30" if min_scale == 1e30 else "1.25e+29"  # the scale of the last step
    assert str(e.value).startswith(
        f"Steps 1..4: every step was skipped (float16 gradients overflowed at the loss "
        f"scale {scale}, train.loss_scale.min_scale={min_scale:g}), so the weights never "
        "changed; "
    ), str(e.value)
    if min_scale == 1.0:
        assert "Run more steps, or lower train.loss_scale.initial_scale" in str(e.value)
    state = rundir.ReadRunState(str(tmp_path / "run"))
    assert state.status == "failed" and state.step == 2  # ckpt-4 never written


def test_eval_and_export_restore_without_warning_about_the_optimizer(tmp_path, caplog):
    import gc

    import tensorflow as tf

    from lingpipe import model_registry, optimizers
    from lingpipe.runners import checkpointer

    RegressionTask(2)  # puts trainer_params on the params package's path
    p = model_registry.GetParams("regression.Regression", "Train")
    p.train.optimizer = optimizers.Adam.Params()  # slots: what eval does not build
    trained = p.Instantiate()
    trained.CreateOptimizer().Build(trained.trainable_variables)
    step = tf.Variable(2, dtype=tf.int64)
    ckpt_dir = str(tmp_path / "checkpoints")
    checkpointer.Checkpointer(ckpt_dir, task=trained, global_step=step).Save(2)
    fresh = p.Instantiate()
    with caplog.at_level("WARNING"):
        assert checkpointer.RestoreLatest(ckpt_dir, [fresh]) == 2
        del fresh  # holds the restore's state, which warns when it is collected
        gc.collect()
    assert not [r for r in caplog.records if "could not be found" in r.getMessage()]


def test_profile_steps_after_the_last_step_are_refused(capsys, tmp_path):
    logdir = tmp_path / "run"
    flags = ("--profile_steps=50,60", "--max_steps=3")
    status, lines = Main(capsys, f"--logdir={logdir}", *flags)
    AssertRefused(
        status,
        lines,
        "--profile_steps=50,60: the run ends at step 3 (train.max_steps), before step 50; "
        "expected steps A,B with A <= 3, so that something is profiled",
    )
    assert not logdir.exists()


def test_eval_with_other_flags_leaves_the_runs_params_files_as_they_were(capsys, tmp_path):
    logdir = tmp_path / "run"
    _SaveOneCheckpoint(logdir)
    for name in ("params.txt", "params_diff.txt"):
        (logdir / name).write_text(f"# {name} of the run that trained\n")
    status, lines = Main(
        capsys, f"--logdir={logdir}", "--mode=eval", "--params_override=train.learning_rate : 0.5"
    )
    assert status == 0, lines
    for name in ("params.txt", "params_diff.txt"):
        assert (logdir / name).read_text() == f"# {name} of the run that trained\n"
    assert (logdir / "eval_dev.json").exists()


def test_a_second_signal_inside_a_finalizer_interrupts_after_it_not_inside_it(capfd):
    import signal
    import time

    from lingpipe.runners import train_loop

    class Resource:
        def __del__(self):  # as TensorFlow's EagerResourceDeleter, run by a deletion
            signal.raise_signal(signal.SIGINT)

    with train_loop.StopSignals() as signals:
        signals.received = "SIGINT"  # the first one: the loop is stopping and saving
        with pytest.raises(KeyboardInterrupt):
            Resource()
            for _ in range(500):
                time.sleep(0.01)
    assert "Exception ignored" not in capfd.readouterr().err


@pytest.mark.slow
def test_sigterm_just_after_the_lock_is_taken_stops_cleanly_and_releases_it(tmp_path):
    import signal
    import time

    logdir = tmp_path / "run"
    lock = logdir / "lingpipe.lock"
    flags = ["--model=regression.Regression", f"--logdir={logdir}", "--max_steps=300"]
    proc = subprocess.Popen(
        Command(*flags), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=Env()
    )
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not lock.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("lingpipe.trainer: Stopped by SIGTERM "), last
    assert last.endswith("rerun the same command to resume"), last
    assert "Traceback" not in stderr and "Exception ignored" not in stderr
    assert not lock.exists()


def test_a_model_too_big_for_the_machine_is_refused_before_it_is_built(capsys, tmp_path):
    logdir = tmp_path / "run"
    status, lines = Main(capsys, f"--logdir={logdir}", "--params_override=model_dims : 1000000000")
    AssertRefused(
        status,
        lines,
        "--model=lm.TransformerLmTiny does not fit: stage 0 of lm/pipeline (on /device:CPU:0) "
        "needs at least ",
    )
    match = re.search(
        r"needs at least ([\d,]+) GiB for its weights, gradients and optimizer slots \(Adam\), "
        r"beyond the ([\d.,]+) GiB of this machine's memory \(the stages are on its CPU\); "
        r"expected a smaller model, more stages, or a machine with more memory$",
        lines[-1],
    )
    assert match, lines[-1]
    # Stage 0 holds at least the embedding, [259, 1e9] floats: 4 bytes each for the
    # weight, its gradient and Adam's two slots.
    assert float(match.group(1).replace(",", "")) >= 259e9 * 16 / 2**30
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert match.group(2) == f"{ram / 2**30:,.1f}"
    assert not logdir.exists()


def test_a_sigterm_before_the_steps_stops_the_run_even_when_the_code_it_hit_re_wraps_it():
    """The handler raises Stopped wherever the main thread is; TensorFlow's tf.Module walk
    re-raises any error from a property as ValueError('Error processing property ...')."""
    import collections.abc
    import signal

    import tensorflow as tf

    from lingpipe.runners import train_loop

    class Schedule(collections.abc.Mapping):  # the walk flattens it, running its code
        def __iter__(self):
            signal.raise_signal(signal.SIGTERM)
            return iter(())

        def __getitem__(self, key):
            raise KeyError(key)

        def __len__(self):
            return 0

    class Optimizer(tf.Module):
        def __init__(self):
            super().__init__()
            self.learning_rate_schedule = Schedule()

    with pytest.raises(train_loop.Stopped, match=r"^Stopped by SIGTERM before any step ran; "):
        with train_loop.StopBeforeSteps():
            assert Optimizer().trainable_variables == ()


def test_a_sigterm_before_the_steps_that_the_code_it_hit_swallows_stops_the_loop():
    import signal

    from lingpipe.runners import train_loop

    with train_loop.StopBeforeSteps():
        try:
            signal.raise_signal(signal.SIGTERM)
        except Exception:  # as a fallback that catches everything (autograph's, say)
            pass
        with train_loop.StopSignals() as signals:
            assert signals.received == "SIGTERM"


@pytest.mark.slow
@pytest.mark.parametrize("sigterm", [pytest.param(False, marks=pytest.mark.extended), True])
def test_a_stopped_worker_is_named_with_the_step_and_the_run_ends(tmp_path, sigterm):
    import signal
    import time

    logdir, ckpt_dir = str(tmp_path / "run"), str(tmp_path / "run" / "checkpoints")
    spec = Cluster(2)
    flags = ["--num_stages=4", "--checkpoint_interval_steps=5", "--log_interval_steps=0"]
    timeout = "600" if sigterm else "8"
    with Workers(spec, str(tmp_path)) as procs:
        chief = Chief(
            spec,
            *flags,
            "--max_steps=100000",
            "--mode=train",
            f"--logdir={logdir}",
            f"--step_timeout_s={timeout}",
            logdir=str(tmp_path),
            tag="chief",
            wait=False,
        )
        try:
            end = time.monotonic() + DEADLINE_S
            while not CheckpointStep(ckpt_dir) >= 10:
                assert chief.poll() is None, Read(str(tmp_path), "chief")[-3000:]
                assert time.monotonic() < end, "no checkpoint appeared in time"
                time.sleep(0.05)
            procs[1].send_signal(signal.SIGSTOP)
            if sigterm:
                time.sleep(2)  # the chief is waiting for the stopped worker
                chief.send_signal(signal.SIGTERM)
            code = chief.wait(timeout=120)  # the deadline is 8 s; the SIGTERM's grace 5 s
        finally:
            procs[1].send_signal(signal.SIGCONT)
            if chief.poll() is None:
                chief.kill()
    log = Read(str(tmp_path), "chief")
    last = LastTrainerLine(log)
    import tensorflow as tf

    latest = tf_latest = tf.train.latest_checkpoint(ckpt_dir)
    # The worker may stop while a step runs or while the chief writes a checkpoint
    # (writing reads every weight from its device): each is bounded and names itself.
    if sigterm:
        assert code == 3, log[-3000:]
        assert re.fullmatch(
            r"lingpipe.trainer: Stopped by SIGTERM while (step \d+|writing checkpoint ckpt-\d+) "
            r"waited for the devices or workers of the run; (nothing of it was saved|the "
            rf"checkpoints are intact) \(latest checkpoint: {re.escape(latest)}\); rerun the "
            r"same command to resume",
            last,
        ), last
    else:
        assert code == 1, log[-3000:]
        assert re.fullmatch(
            r"lingpipe.trainer: error: (Step \d+ did not finish within 8 s|Writing checkpoint "
            r"ckpt-\d+ did not finish within 40 s) \(--step_timeout_s\): "
            rf"worker 1 \({re.escape(spec['worker'][1])}\) does not answer \(stopped or hung\)\. "
            rf"The checkpoints are intact \(latest: {re.escape(latest)}\); .*",
            last,
        ), last
    saved = int(tf_latest.rsplit("-", 1)[1])
    match = re.search(r"(step |ckpt-)(\d+)", last, re.I)
    step = int(match.group(2))
    assert saved >= 10 and (step > saved if match.group(1).lower() == "step " else step >= saved)
    # The newest checkpoint is whole: every tensor of it reads.
    assert Weights(latest)
    assert "Traceback" not in log


def test_an_earlier_export_may_be_replaced_but_nothing_else(tmp_path):
    from lingpipe.runners import preflight, startup

    earlier = tmp_path / "export"
    (earlier / "variables").mkdir(parents=True)
    (earlier / "saved_model.pb").write_bytes(b"")
    (earlier / "fingerprint.pb").write_bytes(b"")
    preflight.CheckExportDir(str(earlier), "--export_dir")  # no error: replaced
    preflight.CheckExportDir(str(tmp_path / "new" / "dir"), "--export_dir")  # created
    for name in "abcd":
        (earlier / f"{name}.txt").write_text("")
    with pytest.raises(startup.UsageError) as e:
        preflight.CheckExportDir(str(earlier), "--export_dir")
    assert str(e.value) == (
        "--export_dir: it holds a.txt, b.txt, c.txt and 1 more, which an export would sit "
        "beside; expected a directory (new, empty, or holding an earlier export)"
    )


def test_a_negative_step_timeout_is_refused(capsys, tmp_path):
    status, lines = Main(capsys, f"--logdir={tmp_path / 'run'}", "--step_timeout_s=-1")
    AssertRefused(
        status, lines, "--step_timeout_s: expected seconds >= 0 (0: no limit), received -1"
    )


def _MainWhileOneCallHangs(capsys, monkeypatch, patch, *flags):
    """Runs the trainer with `flags` while the method of `patch` = (class, name, hangs)
    blocks, as on a stopped worker, in the call whose arguments `hangs` is true of;
    it is released once the run has ended."""
    import threading

    owner, name, hangs = patch
    release, real = threading.Event(), getattr(owner, name)

    def Patched(self, *args):
        if hangs(*args):
            release.wait()
        return real(self, *args)

    monkeypatch.setattr(owner, name, Patched)
    try:
        return Main(capsys, *flags)
    finally:
        release.set()


def test_a_checkpoint_write_that_hangs_is_bounded_like_a_step(capsys, tmp_path, monkeypatch):
    """Writing a checkpoint reads every weight from its device: a worker stopped while
    the chief writes held the trainer for ever, deaf to SIGTERM (seen in CI). The write
    now has a first step's deadline and names itself; the checkpoints stay intact."""

    from lingpipe.runners import checkpointer

    logdir = tmp_path / "run"
    status, lines = _MainWhileOneCallHangs(
        capsys,
        monkeypatch,
        (checkpointer.Checkpointer, "Save", lambda step: step == 4),  # the second write
        f"--logdir={logdir}",
        "--max_steps=6",
        "--checkpoint_interval_steps=2",
        "--step_timeout_s=1.5",
    )
    latest = str(logdir / "checkpoints" / "ckpt-2")
    assert status == 1, lines
    assert lines[-1] == (
        "lingpipe.trainer: error: Writing checkpoint ckpt-4 did not finish within 7.5 s "
        "(--step_timeout_s): a device or worker of the run hangs. The checkpoints are intact "
        f"(latest: {latest}); fix or restart it and rerun the same command to resume."
    ), lines[-3:]


@pytest.mark.parametrize("mode", ["train_and_eval", "eval"])
def test_an_evaluation_that_hangs_is_bounded_like_a_step(capsys, tmp_path, monkeypatch, mode):
    """Evaluating reads every weight from its device, as a step does: a worker stopped
    while the chief evaluates held the trainer for ever. Each batch now has a step's
    deadline (the first a first step's: it traces) and names itself, while training and
    in --mode=eval."""
    import itertools

    from lingpipe.runners import evaler

    logdir = tmp_path / "run"
    step = 2 if mode == "train_and_eval" else 1
    if mode == "eval":
        _SaveOneCheckpoint(logdir)
    calls = itertools.count(1)
    status, lines = _MainWhileOneCallHangs(
        capsys,
        monkeypatch,
        (evaler.Evaler, "_Batch", lambda iterator: next(calls) == 2),  # the second batch
        f"--logdir={logdir}",
        f"--mode={mode}",
        f"--max_steps={step}",
        "--step_timeout_s=1.5",
        "--params_override=eval.samples_per_summary : 0",
    )
    assert status == 1, lines
    latest = str(logdir / "checkpoints" / f"ckpt-{step}")
    assert re.fullmatch(
        rf"lingpipe\.trainer: error: Evaluating Dev batch 2 of \d+ at step {step} did not "
        r"finish within 1\.5 s \(--step_timeout_s\): a device or worker of the run hangs\. The "
        rf"checkpoints are intact \(latest: {re.escape(latest)}\); fix or restart it and rerun "
        r"the same command to resume\.",
        lines[-1],
    ), lines[-3:]
    assert not (logdir / "eval_dev.json").exists()
