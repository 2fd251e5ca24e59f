"""bench/gpu.py: `--smoke` writes every section, each with its figures or a one-line
reason; bad flags are refused in one line; the planner section runs a planner module
once one exists."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

from bench import gpu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
@pytest.mark.extended  # bench/gpu.py ran on a GPU; test_capacity_smoke covers its capacity part
def test_smoke_writes_every_section(tmp_path):
    out = tmp_path / "gpu.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "gpu.py"), "--smoke", f"--out={out}"],
        capture_output=True, text=True, env=env, timeout=360,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["smoke"] and result["wall_s"] < result["total_budget_s"]
    machine = result["machine"]
    for key in ("device", "tf", "cuda_build", "cudnn_build"):
        assert machine[key], key
    assert list(result["sections"]) == list(gpu.SECTIONS)
    for name, section in result["sections"].items():
        if "rows" in section:
            assert section["rows"] and "skipped" not in section, name
            assert not any("oom" in r or "skipped" in r for r in section["rows"]), name
        else:
            assert section["skipped"] and "\n" not in section["skipped"], name
        assert "errors" not in section, (name, section.get("errors"))
    sections = result["sections"]
    # Capacity: the estimate's table on CPU, the ratio at K=8 against naive.
    capacity = sections["capacity"]
    assert "no real out-of-memory" in capacity["note"]
    assert [r["stages"] for r in capacity["rows"]] == [1, 1, 2, 4, 8]
    assert capacity["ratio_k8_vs_naive"] == capacity["rows"][-1]["vs_naive"] > 1
    # Memory on CPU: one allocator, so totals, and the reason in the note.
    memory = sections["memory"]
    assert "one allocator serves every logical CPU device" in memory["note"]
    assert [r["schedule"] for r in memory["rows"]] == ["gpipe", "1f1b", "zbv"]
    for r in memory["rows"]:
        assert r["device"] == "all CPU devices (one allocator)"
        assert r["measured_mib"] > 0 and r["estimate_mib"] > 0
    # Step times side by side, each against its baseline measured in the same process.
    speed = {r["config"]: r for r in sections["speed"]["rows"]}
    assert list(speed) == ["plain", "gpipe", "1f1b", "zero_bubble", "zbv"]
    assert speed["plain"]["vs_plain"] == 1.0 and all(r["ms"] > 0 for r in speed.values())
    precision = {r["config"]: r for r in sections["precision"]["rows"]}
    assert set(precision) == {"plain float32", "1f1b float32", "plain bfloat16 XLA",
                              "1f1b bfloat16 XLA"}  # fmt: skip
    assert precision["1f1b bfloat16 XLA"]["vs_float32"] == pytest.approx(
        precision["1f1b bfloat16 XLA"]["ms"] / precision["1f1b float32"]["ms"]
    )
    # The planner: its plan (on a GPU also the top plans trained and timed, --verify).
    (planned,) = sections["planner"]["rows"]
    assert planned["plan"]["predicted"]["step_seconds"] > 0
    markdown = (tmp_path / "gpu.md").read_text()
    for title in gpu.gpu_report.TITLES.values():
        assert f"## {title}" in markdown
    assert "Device: CPU" in markdown and "K=8 against naive" in markdown


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--sections=capacity,speeed"], "expected --sections from capacity, memory, speed, "
         "precision, planner; received --sections=capacity,speeed"),
        (["--out=gpu.txt"], "expected --out to be a path ending in .json; received --out=gpu.txt"),
    ],
)  # fmt: skip
def test_bad_flags_are_refused_in_one_line(flags, expected, capsys):
    with pytest.raises(SystemExit) as raised:
        gpu.main(flags)
    assert raised.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(expected)


def test_the_planner_section_runs_a_planner_that_exists(tmp_path, monkeypatch):
    (tmp_path / "fake_plan.py").write_text(
        textwrap.dedent(
            """
            import argparse, json
            ap = argparse.ArgumentParser()
            for flag in ("model", "devices", "memory_per_device", "json", "verify", "costs"):
                ap.add_argument("--" + flag)
            args = ap.parse_args()
            json.dump({"model": args.model, "predicted_ms": 1.0, "measured_ms": 1.1},
                      open(args.json, "w"))
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    section = gpu.Planner(gpu.Runner(smoke=True), "fake_plan")
    assert "errors" not in section, section
    (row,) = section["rows"]
    assert row["plan"] == {"model": "lm.TransformerLmTiny", "predicted_ms": 1.0, "measured_ms": 1.1}
    assert section["command"].startswith("python -m fake_plan --model=lm.TransformerLmTiny")
    assert gpu.Planner(gpu.Runner(smoke=True), "no_such_planner.plan")["skipped"].startswith(
        "no_such_planner.plan does not exist yet"
    )


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="a GPU is visible")
def test_without_a_gpu_it_says_so_in_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert gpu.main([f"--out={out}", "--sections=planner"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        "bench/gpu.py: no GPU visible to TensorFlow (tf.config.list_physical_devices('GPU') "
        "is empty); it measures on a GPU, and --smoke runs its code paths on CPU"
    )
    assert not out.exists()
