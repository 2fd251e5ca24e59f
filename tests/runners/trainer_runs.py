"""What the runner tests share: the trainer in a subprocess (Trainer, Command, Env), its
main in this process (Main, AssertRefused), and what they read back (Weights, Listing).

Test files import these from here, never from one another (test_test_imports.py).
"""

import os
import socket
import subprocess
import sys

import tensorflow as tf

from lingpipe import model_registry, trainer

TRAINER_PARAMS = os.path.join(os.path.dirname(__file__), "trainer_params")
# Runs the trainer with tests/runners/trainer_params on the `params` package's path.
LAUNCH = (
    "import sys; from lingpipe import params; params.__path__.append(sys.argv.pop(1)); "
    "from lingpipe import trainer; trainer.Run()"
)
KEY = "lm.TransformerLmTiny"
LM = f"--model={KEY}"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT_S = 240


# ---- The trainer in a subprocess ---------------------------------------------


def Command(*flags):
    """The argv of a trainer process with `flags`."""
    return [sys.executable, "-c", LAUNCH, TRAINER_PARAMS, *flags]


def Env():
    """The environment of a child process: quiet, CPU only, and this checkout's lingpipe first
    (a script in tests/ would otherwise import whichever lingpipe is installed, or none)."""
    path = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", PYTHONPATH=path)


def Trainer(*flags, timeout=TIMEOUT_S):
    """Runs the trainer to its end; returns the CompletedProcess (stdout, stderr as text)."""
    return subprocess.run(
        Command(*flags), capture_output=True, text=True, timeout=timeout, env=Env()
    )


def FreePorts(n):
    """`n` loopback ports free at the time of the call."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


# ---- The trainer's main in this process ---------------------------------------


def MainWithOutput(capsys, *flags, argv=("trainer",)):
    """Runs the trainer's main with `flags` (after --model=KEY --logical_devices=8
    --max_steps=2, which they may repeat to override) and `argv` as what is left after
    the flags; returns (exit status, stdout, stderr lines)."""
    capsys.readouterr()
    trainer.FLAGS.unparse_flags()
    trainer.FLAGS(["trainer", f"--model={KEY}", "--logical_devices=8", "--max_steps=2", *flags])
    try:
        status = trainer.main(list(argv))
    finally:
        trainer.FLAGS.unparse_flags()
    out, err = capsys.readouterr()
    return status, out, err.strip().splitlines()


def Main(capsys, *flags, argv=("trainer",)):
    """MainWithOutput without the stdout: (exit status, stderr lines)."""
    status, _, lines = MainWithOutput(capsys, *flags, argv=argv)
    return status, lines


def AssertRefused(status, lines, message):
    """Exit status 2 and one error line, the last, that holds `message`; no traceback."""
    assert status == 2, lines
    errors = [line for line in lines if line.startswith("lingpipe.trainer: error: ")]
    assert errors == [lines[-1]], lines
    assert message in lines[-1], lines[-1]
    assert not any("Traceback" in line for line in lines)


def WithTrainerParams():
    """Puts tests/runners/trainer_params on the `params` package's path (as LAUNCH does
    for a trainer process), so that regression.* models resolve in this process."""
    from lingpipe import params

    if TRAINER_PARAMS not in params.__path__:
        params.__path__.append(TRAINER_PARAMS)


def RegressionTask(max_steps, learning_rate=None):
    """trainer_params' regression.Regression task with its optimizer, in this process."""
    WithTrainerParams()
    p = model_registry.GetParams("regression.Regression", "Train")
    p.train.max_steps = max_steps
    if learning_rate is not None:
        p.train.learning_rate = learning_rate
    task = p.Instantiate()
    task.CreateOptimizer()
    return task


# ---- What a run wrote ----------------------------------------------------------


def Weights(checkpoint_path):
    """{name: array} of the task's weights (not the optimizer's) in a checkpoint."""
    reader = tf.train.load_checkpoint(checkpoint_path)
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if name.startswith("task/") and "optimizer" not in name
    }


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


def LastTrainerLine(text):
    """The last line the trainer itself wrote ('lingpipe.trainer: ...') in `text`: after a
    worker was killed, TensorFlow's C++ runtime may still log a line or two of its own
    ('Failed to register function remotely ...') as the connection drops."""
    lines = text.strip().splitlines()
    ours = [i for i, line in enumerate(lines) if line.startswith("lingpipe.trainer: ")]
    assert ours, text[-3000:]
    after = lines[ours[-1] + 1 :]
    assert len(after) <= 4, text[-3000:]  # TensorFlow's last words, not a run that went on
    return lines[ours[-1]]
