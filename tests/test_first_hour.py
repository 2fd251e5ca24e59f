"""A new user's first hour with the trainer: bad flags answered at once, the installed
command's --help, a default run's output that fits one screen, a word when training
stops before the learning-rate schedule ends, and no pause after the last evaluation."""

import logging
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest
import tensorflow as tf

from lingpipe import model_registry, tf_logs, trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# As a user's shell has them: no TensorFlow logging settings, no hidden GPUs.
USER_ENV = {
    k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "CUDA_VISIBLE_DEVICES")
}
USER_ENV["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
# What a default run must not print.
NOISE = (
    "All log messages before absl::InitializeLog",
    "oneDNN custom operations",
    "cpu_feature_guard",
    "failed call to cuInit",
    "Efficient batch_reduce",
    "SessionOptions",
    "params_init.method",  # a line of the params dump
)

# Runs the trainer as its installed command does, with any import of TensorFlow refused.
WITHOUT_TENSORFLOW = textwrap.dedent(
    """
    import sys

    class NoTensorFlow:
        def find_spec(self, name, path=None, target=None):
            if name == "tensorflow" or name.startswith("tensorflow."):
                raise ImportError("tensorflow imported before the flags were checked")

    sys.meta_path.insert(0, NoTensorFlow())
    from lingpipe.trainer import Run
    sys.argv[0] = "lingpipe-trainer"
    Run()
    """
)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--num_stages=0", "--logdir=x"], "--num_stages: expected a positive integer, received 0"),
        (["--profile_steps=6,5", "--logdir=x"], "--profile_steps: expected 'A,B' with integers"),
        (
            ["--log_interval_steps=-1", "--logdir=x"],
            "--log_interval_steps: expected an integer >= 0",
        ),
        (["--max_checkpoints_to_keep=0", "--logdir=x"], "--max_checkpoints_to_keep: expected"),
        (["--mode=train"], "--logdir is required for --mode=train"),
    ],
)
def test_a_bad_flag_exits_2_before_tensorflow_is_imported(flags, message, tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_TENSORFLOW, *flags],
        cwd=tmp_path,
        env=USER_ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"lingpipe.trainer: error: {message}"), done.stderr
    assert os.listdir(tmp_path) == []


def test_trainer_exit_skips_the_last_garbage_collection(tmp_path):
    """Python's last collection at exit walked every object TensorFlow made: 3-8 s of
    silence after the last line. The trainer freezes them (the OS frees them)."""
    script = (
        "import atexit, gc\n"
        "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0))\n" + WITHOUT_TENSORFLOW
    )
    done = subprocess.run(
        [sys.executable, "-c", script, "--num_stages=0", "--logdir=x"],
        cwd=tmp_path,
        env=USER_ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == "frozen True\n", done


def test_installed_command_help_shows_the_description_and_exit_codes():
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_TENSORFLOW, "--help"],
        env=USER_ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(trainer.__doc__.splitlines()[0]), done.stdout[:300]
    assert "Exit status, and what SIGTERM or SIGINT (Ctrl-C) does" in done.stdout
    assert "\n  0    done\n  1    training failed: " in done.stdout
    assert "--model: Registered model to run" in done.stdout


def _Warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_training_that_stops_before_the_schedule_ends_says_so(caplog):
    p = model_registry.GetParams("lm.TransformerLmTiny", "Train")
    assert p.train.lr_schedule.total_steps == p.train.max_steps == 400
    with caplog.at_level(logging.WARNING):
        trainer._NoteShortSchedule(p)
        assert _Warnings(caplog) == []
        p.train.max_steps = 200  # what --max_steps=200 does
        trainer._NoteShortSchedule(p)
    assert _Warnings(caplog) == [
        "Training stops at step 200, before the learning-rate schedule's decay ends "
        "(train.lr_schedule.total_steps : 400, Cosine); to fit it to the run, set "
        "--params_override='train.lr_schedule.total_steps : 200'"
    ]


def test_train_input_has_no_autotuning_thread_to_wait_for():
    """Deleting an iterator waited for tf.data's autotuning thread to wake (up to 60 s):
    the trainer paused 15-40 s between its last evaluation and `Done`."""
    for dataset in ("Train", "Dev"):
        p = model_registry.GetParams("lm.TransformerLmTiny", dataset).input
        assert p.Instantiate().GetDataset().options().autotune.enabled is False, dataset


def test_tensorflow_starts_without_its_banner():
    script = (
        "from lingpipe import tf_logs\n"
        "tf_logs.ImportTensorFlow()\n"
        "import sys, tensorflow as tf\n"
        "print(len(tf.config.list_logical_devices('CPU')), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=USER_ENV, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "1\n"


def test_banner_filter_keeps_every_other_line():
    text = (
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
        "I0000 00:00:1.1 4498 port.cc:153] oneDNN custom operations are on. You may see...\n"
        "I0000 00:00:1.2 4498 cudart_stub.cc:31] Could not find cuda drivers on your machine\n"
        "W0000 00:00:1.3 4498 something.cc:1] a warning of the user's\n"
        "E0000 00:00:1.4 4498 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error\n"
        "Traceback (most recent call last):\n"
    )
    assert tf_logs.FilterBanner(text) == (
        "W0000 00:00:1.3 4498 something.cc:1] a warning of the user's\n"
        "Traceback (most recent call last):\n"
    )
    # With a driver installed, a failing cuInit is news: it stays.
    assert "failed call to cuInit" in tf_logs.FilterBanner(text.replace("Could not find", "Found"))


def test_tensorflow_log_noise_is_dropped_and_others_kept():
    from absl import logging as absl_logging

    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    loggers = [tf.get_logger(), absl_logging.get_absl_logger()]
    handler = Keep()
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    try:
        tf_logs.QuietPythonWarnings()
        for logger in loggers:
            logger.warning("Efficient batch_reduce is not supported if destinations are different.")
            # tensorflow/python/eager/remote.py, connecting to the stage hosts:
            logger.warning("default session config: %s", 'device_count {\n  key: "GPU"\n}')
            logger.info(
                "Function `Serve` contains input name(s) resource with unsupported characters "
                "which will be renamed to f_s1_mb0_readvariableop_resource in the SavedModel."
            )
            logger.info("Writing fingerprint to /tmp/lp/export/400/fingerprint.pb")
            logger.warning("something else")
    finally:
        for logger, level in zip(loggers, levels):
            logger.removeHandler(handler)
            logger.setLevel(level)
    assert seen == ["something else"] * 2


def test_the_worker_catches_a_stop_signal_sent_the_moment_it_says_ready(monkeypatch, capsys):
    # The stage host's test below stops it on 'ready'. Its handler once came after the
    # line, and a SIGTERM in between ended it silently (the default action), one run
    # in a few: here the signal is sent from within the print of 'ready' itself.
    import json
    import signal

    from lingpipe import tf_logs, worker

    config = {
        "cluster": {"chief": ["a:1"], "worker": ["b:2"]},
        "task": {"type": "worker", "index": 0},
    }
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    monkeypatch.setattr(tf_logs, "ImportTensorFlow", lambda: None)
    monkeypatch.setattr(worker, "_StartServer", lambda *args: (None, ["/device:CPU:0"]))

    def Exit(code):
        raise SystemExit(code)

    def Print(*args, **kwargs):
        print(*args, **kwargs)
        if args and str(args[0]).endswith(": ready"):
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(worker.os, "_exit", Exit)
    monkeypatch.setattr(worker, "print", Print, raising=False)
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with pytest.raises(SystemExit) as ended:
            worker.main(["--logical_devices=0"])
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    assert ended.value.code == 0
    ready, stopped = capsys.readouterr().out.splitlines()[-2:]
    assert ready == "lingpipe.worker: ready"
    assert re.fullmatch(_STOPPED, stopped), stopped


def test_stage_host_prints_its_devices_and_no_banner(tmp_path):
    import json
    import signal
    import socket

    with socket.socket() as a, socket.socket() as b:
        a.bind(("localhost", 0))
        b.bind(("localhost", 0))
        chief, worker = (f"localhost:{s.getsockname()[1]}" for s in (a, b))
    config = {
        "cluster": {"chief": [chief], "worker": [worker]},
        "task": {"type": "worker", "index": 0},
    }
    log = tmp_path / "worker.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lingpipe.worker", "--logical_devices=2"],
            env=dict(USER_ENV, TF_CONFIG=json.dumps(config)),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            for _ in range(1200):  # until it says it is ready (at most 120 s)
                if proc.poll() is not None or "ready" in log.read_text():
                    break
                time.sleep(0.1)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    *lines, stopped = log.read_text().splitlines()
    assert lines == [
        f"lingpipe.worker: serving worker 0 at {worker} with 2 device(s):",
        "  /job:worker/replica:0/task:0/device:CPU:0",
        "  /job:worker/replica:0/task:0/device:CPU:1",
        "lingpipe.worker: ready",
    ]
    assert re.fullmatch(_STOPPED, stopped), stopped


# The worker's last line: how it stopped, and the most its devices' allocator held.
_STOPPED = (
    r"lingpipe\.worker: stopped by SIGTERM; "
    r"peak memory: CPU \(one allocator\) [0-9.]+ MiB \([0-9]+ bytes\)"
)


@pytest.mark.slow
@pytest.mark.extended  # .ci/run runs the default job itself; the other first-hour cases stay
def test_default_run_prints_one_screen_besides_progress(tmp_path):
    """The README's first command, as printed (progress lines come only on a terminal)."""
    logdir = tmp_path / "lp"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lingpipe.trainer",
            "--model=lm.TransformerLmTiny",
            f"--logdir={logdir}",
        ],
        cwd=tmp_path,
        env=USER_ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (done.stdout + done.stderr).splitlines()
    progress = [line for line in lines if re.search(r"\] step \d+/\d+ ", line)]
    assert len(lines) - len(progress) <= 40, "\n".join(lines)
    for noise in NOISE:
        assert noise not in done.stdout + done.stderr, noise
    assert re.search(r"\] Params in .*/params\.txt; as lm\.TransformerLmTiny$", done.stderr, re.M)
    assert re.search(r"\] Done at step 400: Dev at step 400: ", done.stderr)
