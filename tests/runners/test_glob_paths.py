"""Paths that TensorFlow reads as glob patterns (issue 30): its own loaders find nothing
under `lr[0.1]` and its checkpoint manager, under `lr?`, deletes other runs' checkpoints.
A logdir, export directory or checkpoint directory holding `[`, `]`, `*`, `?` or `\\` is
refused before anything is written, naming a path to use; a run under the name it names
loads in a process that imports TensorFlow alone."""

import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf
from trainer_runs import KEY, AssertRefused, Listing, Main

from lingpipe import export, glob_paths, model_registry
from lingpipe.runners import checkpointer, startup

EXPECTED = "expected a path without '[', ']', '*', '?' or '\\'"
WHY = (
    "TensorFlow reads checkpoint and SavedModel paths as glob patterns: under such a name "
    "its loaders find no files, or its checkpoint manager deletes other runs' checkpoints"
)

LOAD_WITH_TENSORFLOW_ALONE = textwrap.dedent(
    """
    import sys
    import tensorflow as tf
    export, checkpoints = sys.argv[1:]
    logits = tf.saved_model.load(export).signatures["serving_default"](
        ids=tf.ones([2, 8], tf.int32))["logits"]
    step = tf.train.load_checkpoint(checkpoints).get_tensor(
        "global_step/.ATTRIBUTES/VARIABLE_VALUE")
    print(logits.shape.as_list(), int(step), "lingpipe" in sys.modules)
    """
)


def _LoadWithTensorFlowAlone(export_dir, checkpoint_dir):
    """What a process importing only TensorFlow reads: logits' shape, step, lingpipe seen."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [sys.executable, "-c", LOAD_WITH_TENSORFLOW_ALONE, str(export_dir), str(checkpoint_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "name, instead", [("lr[0.1]", "lr0.1"), ("lr*", "lr_"), ("lr?", "lr_"), ("a\\b", "a_b")]
)
def test_a_new_run_named_like_a_glob_is_refused_before_anything_is_written(
    capsys, tmp_path, name, instead
):
    logdir = tmp_path / "runs" / name
    status, lines = Main(capsys, f"--logdir={logdir}")
    AssertRefused(
        status,
        lines,
        f"lingpipe.trainer: error: --logdir={logdir}: {EXPECTED} ({WHY}); choose another "
        f"name, e.g. --logdir={tmp_path / 'runs' / instead}",
    )
    assert not (tmp_path / "runs").exists()


def test_a_run_renamed_as_the_refusal_says_loads_with_tensorflow_alone(capsys, tmp_path):
    """A run under lr[0.1] (from a release that accepted the name): every mode is
    refused without a write; renamed as the line says, its export and its checkpoints
    load in a process without lingpipe."""
    good, bad = tmp_path / "lr0.1", tmp_path / "lr[0.1]"
    # Its checkpoint as the trainer writes it, without the seconds of a training step.
    task = model_registry.GetParams(KEY, "Train").Instantiate()
    step = tf.Variable(1, dtype=tf.int64)
    checkpointer.Checkpointer(str(good / "checkpoints"), task=task, global_step=step).Save(1)
    os.rename(good, bad)
    before = Listing(tmp_path)
    for mode in ("train", "eval", "export"):
        status, lines = Main(capsys, f"--logdir={bad}", f"--mode={mode}")
        AssertRefused(
            status,
            lines,
            f"lingpipe.trainer: error: --logdir={bad}: {EXPECTED} ({WHY}); rename it, e.g. "
            f"to {good}, and rerun with --logdir={good}",
        )
    assert Listing(tmp_path) == before
    os.rename(bad, good)
    before = Listing(tmp_path)
    exported = tmp_path / "out[1]"
    status, lines = Main(capsys, f"--logdir={good}", "--mode=export", f"--export_dir={exported}")
    AssertRefused(
        status,
        lines,
        f"lingpipe.trainer: error: --export_dir={exported}: {EXPECTED} ({WHY}); choose another "
        f"name, e.g. --export_dir={tmp_path / 'out1'}",
    )
    assert Listing(tmp_path) == before
    status, lines = Main(capsys, f"--logdir={good}", "--mode=export")
    assert status == 0, lines
    loaded = _LoadWithTensorFlowAlone(good / "export" / "1", good / "checkpoints")
    assert loaded == "[2, 8, 259] 1 False"


def test_the_library_refuses_glob_paths_and_spares_other_runs(tmp_path):
    runs = tmp_path / "runs"
    other = checkpointer.Checkpointer(str(runs / "lr1"), v=tf.Variable(1.0))
    other.Save(1)
    kept = sorted(os.listdir(runs / "lr1"))
    directory = str(runs / "lr?")
    with pytest.raises(ValueError) as refused:
        checkpointer.Checkpointer(directory, max_to_keep=1, v=tf.Variable(2.0))
    assert str(refused.value) == (
        f"Checkpointer: directory={directory}: {EXPECTED} ({WHY}); choose another name, "
        f"e.g. {runs / 'lr_'}"
    )
    assert sorted(os.listdir(runs / "lr1")) == kept and not os.path.exists(directory)
    directory = str(tmp_path / "export[1]")
    with pytest.raises(ValueError) as refused:
        export.Export(None, directory)  # The path is refused before the task is read.
    assert str(refused.value) == (
        f"export.Export: directory={directory}: {EXPECTED} ({WHY}); choose another name, "
        f"e.g. {tmp_path / 'export1'}"
    )
    assert not os.path.exists(directory)


def test_what_the_refusal_names_instead(tmp_path, monkeypatch):
    # The name it suggests may be another run's: a number keeps them apart.
    (tmp_path / "lr0.1").mkdir()
    assert glob_paths.Refusal(str(tmp_path / "lr[0.1]"), "x", "--logdir").endswith(
        f"choose another name, e.g. --logdir={tmp_path / 'lr0.1-2'}"
    )
    # A relative path inherits the working directory's glob characters.
    (tmp_path / "p[1]").mkdir()
    monkeypatch.chdir(tmp_path / "p[1]")
    assert glob_paths.Refusal("run", "--logdir=run", "--logdir") == (
        f"--logdir=run: {EXPECTED}, received {tmp_path / 'p[1]' / 'run'} ({WHY}); run from a "
        "directory whose path has none of them, or give an absolute path without them"
    )
    assert glob_paths.Refusal(str(tmp_path / "lr=0.1,{a}"), "x") == ""
    with pytest.raises(startup.UsageError) as refused:
        startup.CheckLogdir("ram://runs/lr[0.1]")
    assert str(refused.value) == (
        f"--logdir=ram://runs/lr[0.1]: {EXPECTED} ({WHY}); choose another name, e.g. "
        "--logdir=ram://runs/lr0.1"
    )
