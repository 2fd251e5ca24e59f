"""bench/plan.py --quick: every configuration of the quick grid predicted and measured,
the JSON's fields consistent, and the planner's picks within their caps."""

import json

import pytest

from bench import plan


@pytest.mark.extended  # a benchmark's code path; tests/test_plan.py tests the planner
def test_plan_quick_writes_predicted_and_measured(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert plan.main(["--quick", "--steps=2", f"--out={out}"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["machine"]["cpu_count"] and result["date"] and result["grid"]["quick"]
    rows = result["rows"]
    # R=2 x K=1 (gpipe only) and R=1 x K=2 (1f1b, zero_bubble), M=4, remat never.
    got = sorted((r["R"], r["K"], r["M"], r["schedule"]) for r in rows)
    want = sorted([(2, 1, 4, "gpipe"), (1, 2, 4, "1f1b"), (1, 2, 4, "zero_bubble")])
    assert got == want
    for r in rows:
        assert "error" not in r, r
        assert r["measured_s"] > 0 and r["predicted_s"] > 0 and r["calibrated_s"] > 0
        assert r["calibrated_err"] == pytest.approx(r["calibrated_s"] / r["measured_s"] - 1)
        assert len(r["peak_device_mib"]) == r["K"]
        assert r["predicted_mib"] == pytest.approx(r["R"] * sum(r["peak_device_mib"]))
        assert r["memory_err"] == pytest.approx(r["predicted_mib"] / r["measured_mib"] - 1)
    assert result["summary"]["memory_err"]["n"] == len(rows)
    assert result["summary"]["memory_err"]["most_below"] == min(r["memory_err"] for r in rows)
    assert all(r["load"] >= 0 for r in rows)
    # Where the predictions miss: one row per schedule, M, remat and R x K.
    by = {(e["by"], e["value"]): e for e in result["errors_by"]}
    schedules = {("schedule", s) for s in ("gpipe", "1f1b", "zero_bubble")}
    others = {("M", "4"), ("remat", "never"), ("RK", "R=2 K=1"), ("RK", "R=1 K=2")}
    assert set(by) == schedules | others
    assert by[("M", "4")]["n"] == 3
    cal = result["runs"]["mlp"]["calibration"]
    assert len(cal["scales"]) == 2 and cal["num_actions"] > 0
    assert len(result["picks"]) == 2
    for p in result["picks"]:
        pick = next(r for r in rows if plan._Name(r) == p["pick"])
        assert max(pick["peak_device_mib"]) <= p["cap_mib"]
        assert p["pick_vs_best"] >= 0
