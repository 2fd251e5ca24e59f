"""Trainer start-up: override text, params resolution order, logdir checks, atomic writes."""

import os
import stat

import pytest
import tensorflow as tf

from lingpipe.runners import startup

LM = "lm.TransformerLmTiny"


def test_split_overrides_at_semicolons_and_newlines_outside_quotes_and_brackets():
    text = 'a.b : 1; c : \'x;y\'\n d : [1, 2; 3]\n\ne : "q\\";" ;'
    assert startup.SplitOverrides(text) == ["a.b : 1", "c : 'x;y'", "d : [1, 2; 3]", 'e : "q\\";"']


def test_resolution_order_file_then_override_then_shortcuts(tmp_path):
    params_file = tmp_path / "p.txt"
    params_file.write_text("model_dims : 32\nnum_heads : 4\ntrain.max_steps : 7\n")
    resolved = startup.ResolveParams(
        LM,
        startup.Overrides(
            params_file=str(params_file),
            params_override="num_heads : 8; train.learning_rate : 0.5",
            max_steps=9,
            num_stages=1,
            num_micro_batches=4,
            seed=3,
        ),
    )
    p = resolved.task
    assert (p.model_dims, p.num_heads, p.train.learning_rate) == (32, 8, 0.5)
    assert (p.train.max_steps, p.num_stages, p.num_micro_batches) == (9, 1, 4)
    assert p.random_seed == 3 and p.input.seed == 3
    assert resolved.defaults.model_dims == 64 and resolved.defaults.input.seed == 0
    assert resolved.eval_datasets == ["Dev", "Test"]
    dev = resolved.EvalTaskParams("Dev")
    assert dev.input.split == "dev" and dev.input.seed == 3 and dev.model_dims == 32


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            startup.Overrides(params_override="train.lerning_rate : 0.1"),
            r"cannot apply 'train.lerning_rate : 0.1'.*Did you mean: \['learning_rate'\]",
        ),
        (
            startup.Overrides(params_override="model_dims : open('/etc/passwd').read()"),
            r"value for 'model_dims' is not a literal",
        ),
        (startup.Overrides(params_override="model_dims : 'big'"), r"model_dims' expects int"),
        (startup.Overrides(params_file="/no/such/file"), r"--params_file=/no/such/file: cannot"),
        (startup.Overrides(max_steps=0), r"--max_steps: expected a positive integer, received 0"),
        (startup.Overrides(seed=-1), r"--seed: expected an integer >= 0, received -1"),
        (
            startup.Overrides(num_micro_batches=0),
            r"--num_micro_batches: expected a positive integer, received 0",
        ),
    ],
)
def test_resolution_errors(overrides, message):
    with pytest.raises(startup.UsageError, match=message):
        startup.ResolveParams(LM, overrides)


def test_remat_per_stage_from_an_override_or_a_params_file(tmp_path):
    resolved = startup.ResolveParams(
        LM, startup.Overrides(params_override="remat : ['always', 'never']", num_stages=2)
    )
    assert resolved.task.remat == ["always", "never"]
    pipeline = resolved.task.Instantiate().pipeline
    assert pipeline.KeptActivations(pipeline.Schedule(2)) == {(1, 0), (1, 1)}
    params_file = tmp_path / "p.txt"
    params_file.write_text("remat : ('never', 'except_last')\n")
    overrides = startup.Overrides(params_file=str(params_file))
    assert startup.ResolveParams(LM, overrides).task.remat == ("never", "except_last")
    overrides.params_override = "remat : 'never'"
    assert startup.ResolveParams(LM, overrides).task.remat == "never"
    with pytest.raises(startup.UsageError, match=r"'remat' expects str, list or tuple"):
        startup.ResolveParams(LM, startup.Overrides(params_override="remat : 1"))


def test_unknown_model_and_family():
    with pytest.raises(startup.UsageError, match=r"--model=lm.Nope: Unknown model 'lm.Nope'"):
        startup.ResolveParams("lm.Nope", startup.Overrides())
    with pytest.raises(startup.UsageError, match=r"Unknown model family 'nofam'"):
        startup.ResolveParams("nofam.X", startup.Overrides())


def test_check_logdir(tmp_path):
    assert startup.CheckLogdir(str(tmp_path / "a" / "b")) == str(tmp_path / "a" / "b")
    assert not (tmp_path / "a").exists()  # Nothing is created while checking.
    (tmp_path / "f").write_text("x")
    with pytest.raises(startup.UsageError, match=r"is a file; expected a directory"):
        startup.CheckLogdir(str(tmp_path / "f"))
    with pytest.raises(startup.UsageError, match=r"f is a file, so .*f/sub cannot be created"):
        startup.CheckLogdir(str(tmp_path / "f" / "sub"))
    with pytest.raises(startup.UsageError, match=r"--logdir: expected a directory"):
        startup.CheckLogdir("")


def test_write_params_full_text_and_diff(tmp_path):
    resolved = startup.ResolveParams(LM, startup.Overrides(params_override="model_dims : 32"))
    text, diff = startup.WriteParams(str(tmp_path), resolved)
    written = (tmp_path / startup.PARAMS_FILE).read_text()
    assert written.endswith(text) and "model_dims : 32\n" in written
    assert diff == "> model_dims : 32\n< model_dims : 64\n"
    assert (tmp_path / startup.PARAMS_DIFF_FILE).read_text().endswith(diff)
    assert sorted(os.listdir(tmp_path)) == sorted([startup.PARAMS_DIFF_FILE, startup.PARAMS_FILE])


def test_url_logdirs_go_through_gfile_and_never_to_the_local_disk(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # TensorFlow's in-memory file system stands in for a bucket.
    logdir = startup.CheckLogdir("ram://lingpipe_test_startup/run")
    assert logdir == "ram://lingpipe_test_startup/run"
    resolved = startup.ResolveParams(LM, startup.Overrides(params_override="model_dims : 32"))
    tf.io.gfile.makedirs(logdir)
    startup.WriteParams(logdir, resolved)
    assert sorted(tf.io.gfile.listdir(logdir)) == [startup.PARAMS_FILE, startup.PARAMS_DIFF_FILE]
    with tf.io.gfile.GFile(f"{logdir}/{startup.PARAMS_FILE}") as f:
        assert "model_dims : 32\n" in f.read()
    with tf.io.gfile.GFile("ram://lingpipe_test_startup/a_file", "w") as f:
        f.write("x")
    with pytest.raises(startup.UsageError, match=r"a_file is a file; expected a directory"):
        startup.CheckLogdir("ram://lingpipe_test_startup/a_file")
    # A bucket that cannot be reached is refused by name, and nothing lands in ./gs:/.
    with pytest.raises(startup.UsageError, match=r"--logdir=gs://no-such-bucket/run: cannot "):
        startup.CheckLogdir("gs://no-such-bucket/run")
    assert os.listdir(tmp_path) == []
    tf.io.gfile.rmtree("ram://lingpipe_test_startup")


def test_written_files_get_the_usual_mode(tmp_path):
    old = os.umask(0o022)
    try:
        startup.WriteAtomically(str(tmp_path / "f.txt"), "text")
    finally:
        os.umask(old)
    assert (tmp_path / "f.txt").read_text() == "text"
    assert stat.S_IMODE(os.stat(tmp_path / "f.txt").st_mode) == 0o644
    assert os.listdir(tmp_path) == ["f.txt"]  # No temporary file left.
