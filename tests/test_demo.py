"""The README's first command: python -m lingpipe.demo trains pipelined == plain."""

import subprocess
import sys

import pytest


def _Demo(*flags):
    return subprocess.run(
        [sys.executable, "-m", "lingpipe.demo", "--num_layers=2", "--batch=4", "--steps=3", *flags],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_demo_trains_the_pipeline_like_the_plain_stack():
    done = _Demo("--num_stages=2", "--num_micro_batches=2", "--remat=except_last")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "OK: same training, pipelined" in done.stdout
    assert "/device:CPU:1" in done.stdout  # the partition report
    table = done.stdout.split("pipelined loss")[1].split("\n\n")[0]
    losses = [[float(v) for v in line.split()[1:]] for line in table.strip().splitlines()[1:]]
    assert len(losses) == 3
    assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in losses), losses


@pytest.mark.parametrize(
    "flag, expected",
    [
        ("--remat=sometimes", "flag --remat=sometimes: value should be one of <always|"),
        ("--num_layers=0", "flag --num_layers=0: 0 is not a positive integer"),
    ],
)
def test_demo_rejects_a_bad_flag_in_one_line_with_status_2(flag, expected):
    done = _Demo(flag)
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()  # before TensorFlow starts: nothing else printed
    assert line.startswith("lingpipe.demo: error: " + expected), line
