"""python -m lingpipe.plan: the plan of a registered model, its JSON, and bad input in one
line with exit status 2 and nothing written."""

import json
import subprocess
import sys

import pytest

from lingpipe import plan


@pytest.mark.parametrize(
    "text,expected",
    [("16GiB", 16 * 2**30), ("512MiB", 512 * 2**20), ("1.5GB", 1_500_000_000), ("4096", 4096)],
)
def test_sizes(text, expected):
    assert plan.ParseSize(text) == expected


def _Run(tmp_path, *flags):
    cmd = [sys.executable, "-m", "lingpipe.plan", "--model=lm.TransformerLmTiny", *flags]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)


def test_a_plan_and_its_json(tmp_path):
    out = tmp_path / "plan.json"
    done = _Run(tmp_path, "--devices=2", "--memory_per_device=8MiB", f"--json={out}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "python -m lingpipe.trainer --model=lm.TransformerLmTiny" in done.stdout
    written = json.loads(out.read_text())
    assert set(written) >= {"plan", "predicted", "candidates"}
    assert written["predicted"]["step_seconds"] > 0
    assert all(b <= 8 * 2**20 for b in written["predicted"]["peak_bytes"])
    assert written["plan"]["num_stages"] in (1, 2)
    assert written["for"] == {
        "model": "lm.TransformerLmTiny",
        "devices": 2,
        "global_batch": 32,
        "memory_per_device": 8 * 2**20,
    }
    # What the trainer's --plan=FILE reads: its flags, the partition as counts per stage.
    from lingpipe.runners import plan_flags

    assert set(written["plan"]) <= set(plan_flags.PLAN_FLAGS)
    assert sum(written["plan"]["partition"]) == 4  # the tiny LM's cells
    assert plan_flags.ReadPlan(str(out), "lm.TransformerLmTiny") == written


@pytest.mark.parametrize(
    "flags,line",
    [
        (["--devices=0", "--memory_per_device=1GiB"], "--devices=0: expected a number of"),
        (["--devices=2", "--memory_per_device=12XB"], "--memory_per_device=12XB: expected a"),
        (
            ["--devices=2", "--memory_per_device=1MiB"],
            "--memory_per_device=1.0 MiB: no plan of lm.TransformerLmTiny on 2 device(s) fits; "
            "the smallest needs",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2_with_nothing_written(tmp_path, flags, line):
    out = tmp_path / "plan.json"
    done = _Run(tmp_path, *flags, f"--json={out}")
    assert done.returncode == 2
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("lingpipe.plan:")]
    assert len(errors) == 1 and line in errors[0], done.stderr[-2000:]
    assert not out.exists()
