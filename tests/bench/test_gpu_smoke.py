"""bench/gpu.py: `--smoke` writes every section, each with its figures or a one-line
reason; bad flags are refused in one line; the planner part plans, then trains its
picks."""

import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from bench import budget, gpu, gpu_plan

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
    # The planner: its plan, and its pick and runner-up trained and measured.
    planner = sections["planner"]
    assert planner["plan"]["pick"] == planner["rows"][0]["plan"]
    assert [r["rank"] for r in planner["rows"]] == [0, 1]
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
        (["--total_s=-1"], "expected --total_s to be seconds >= 0; received --total_s=-1"),
    ],
)  # fmt: skip
def test_bad_flags_are_refused_in_one_line(flags, expected, capsys):
    with pytest.raises(SystemExit) as raised:
        gpu.main(flags)
    assert raised.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(expected)


def test_the_planner_part_plans_then_measures_its_picks_on_the_devices(capsys):
    devices = ["/device:CPU:0", "/device:CPU:1"]
    asked = []

    def Setup(n, smoke, device_mib):
        asked.append((n, smoke, device_mib))
        return devices[:n]

    gpu_plan.Planner(smoke=True, budget_s=600, setup=Setup)
    assert asked == [(2, True, gpu_plan.SIZES["smoke"]["cap_mib"])]
    lines = budget.JsonLines(capsys.readouterr().out)
    (plan,) = [x for x in lines if x["kind"] == "plan"]
    assert plan["pick"].startswith("R=1 x K=2") and plan["unrestricted_pick"]
    rows = [x for x in lines if x["kind"] == "row"]
    # The pick and the runner-up, each trained: one allocator on CPU, so one row each.
    assert [r["rank"] for r in rows] == [0, 1] and rows[0]["plan"] == plan["pick"]
    for r in rows:
        assert r["device"] == "all CPU devices (one allocator)"
        assert r["measured_ms"] > 0 and r["predicted_ms"] > 0
        assert (
            r["measured_mib"] > 0 and r["predicted_mib"] <= gpu_plan.SIZES["smoke"]["cap_mib"] * 2
        )
        assert r["step_error"] == pytest.approx(r["predicted_ms"] / r["measured_ms"] - 1)


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
