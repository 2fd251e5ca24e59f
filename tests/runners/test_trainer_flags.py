"""The trainer's command line: a bad flag is one line and exit status 2, --help is 0.

Flags are parsed before TensorFlow is imported, so these subprocesses are fast.
"""

import os
import subprocess
import sys

import pytest


def _Trainer(*flags):
    return subprocess.run(
        [sys.executable, "-m", "lingpipe.trainer", *flags],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES=""),
    )


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--max_steps=abc", "flag --max_steps=abc: invalid literal for int() with base 10: 'abc'"),
        ("--mode=bogus", "flag --mode=bogus: value should be one of <train|eval|"),
        ("--max_step=3", "Unknown command line flag 'max_step'. Did you mean: max_steps ?"),
    ],
)
def test_a_bad_flag_exits_2_with_one_line(flag, message):
    result = _Trainer(flag)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("lingpipe.trainer: error: "), result.stderr
    assert message in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stdout == ""


def test_help_exits_0():
    result = _Trainer("--help")
    assert result.returncode == 0, result.stderr
    assert "--max_steps" in result.stdout


def _Collapsed(text):
    return " ".join(text.split())


def test_help_and_the_trainer_guide_give_the_same_exit_statuses():
    shown = _Trainer("--help").stdout
    in_help = shown[shown.index("Exit status,") : shown.index("\nflags:")]
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "trainer.md")) as f:
        readme = f.read()
    start = readme.index("```text\nExit status,") + len("```text\n")
    in_readme = readme[start : readme.index("```", start)]
    assert _Collapsed(in_help) == _Collapsed(in_readme)
    assert "130  a second SIGTERM or SIGINT in the train loop" in in_help
