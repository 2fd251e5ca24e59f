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
        # One allocator's peak (memory.HostMemory) is at most the devices' peaks added.
        assert r["devices_sum_mib"] == pytest.approx(r["R"] * sum(r["peak_device_mib"]))
        assert r["predicted_mib"] <= r["devices_sum_mib"] * (1 + 1e-9)
        assert r["memory_err"] == pytest.approx(r["predicted_mib"] / r["measured_mib"] - 1)
        # A profiled step: its tensors asked for no more than the allocator held.
        assert 0 < r["tensors_mib"] <= r["profiled_mib"]
        assert r["tensors_err"] == pytest.approx(r["predicted_mib"] / r["tensors_mib"] - 1)
    assert result["summary"]["memory_err"]["n"] == len(rows)
    assert result["summary"]["memory_err"]["most_below"] == min(r["memory_err"] for r in rows)
    assert all(r["load"] >= 0 for r in rows)
    # Where the predictions miss: one row per schedule, M, remat and R x K.
    by = {(e["by"], e["value"]): e for e in result["errors_by"]}
    schedules = {("schedule", s) for s in ("gpipe", "1f1b", "zero_bubble")}
    others = {("M", "4"), ("remat", "never"), ("RK", "R=2 K=1"), ("RK", "R=1 K=2")}
    assert set(by) == schedules | others
    assert by[("M", "4")]["n"] == 3
    # The rates and the profile at the start, before rows 1 and 2, and at the end.
    assert len(result["runs"]["mlp"]["probes"]) == 4
    cal = result["runs"]["mlp"]["calibration"]
    assert len(cal["scales"]) == 2 and cal["num_actions"] > 0
    assert len(result["picks"]) == 2
    for p in result["picks"]:
        pick = next(r for r in rows if plan._Name(r) == p["pick"])
        assert max(pick["peak_device_mib"]) <= p["cap_mib"]
        assert p["pick_vs_best"] >= 0


def _Row(model, m, seconds, mib, cells=(2, 2)):
    return dict(model=model, R=1, K=2, M=m, schedule="1f1b", v=1, remat="never",
                cells=list(cells), measured_s=seconds, measured_mib=mib)  # fmt: skip


def test_repeat_compares_each_configuration_with_the_same_in_an_earlier_run():
    now = [_Row("lm", 1, 0.11, 90.0), _Row("lm", 2, 0.10, 100.0), _Row("lm", 4, 0.1, 1.0),
           _Row("mlp", 1, 0.02, 10.0), dict(model="mlp", error="OOM")]  # fmt: skip
    # M=4 and the MLP's row have no twin then; a row of other cells is another configuration.
    then = dict(rows=[_Row("lm", 1, 0.10, 100.0), _Row("lm", 2, 0.10, 80.0),
                      _Row("mlp", 1, 0.04, 10.0, cells=(3, 1))])  # fmt: skip
    (lm,) = plan.Repeat(now, then, "then.json")
    assert (lm["model"], lm["rows"], lm["against"]) == ("lm", 2, "then.json")
    assert lm["step_median"] == pytest.approx(0.05) and lm["step_worst"] == pytest.approx(0.1)
    assert lm["memory_median"] == pytest.approx(0.175) and lm["memory_worst"] == pytest.approx(0.25)


def test_rescore_makes_the_tables_again_without_measuring(tmp_path, capsys):
    rows = [
        dict(
            _Row("mlp", 1, 0.02, 10.0),
            predicted_err=0.1,
            calibrated_err=0.1,
            predicted_err_best=0.1,
            calibrated_err_best=0.1,
            memory_err=-0.2,
            actions="a",
            measured_best_s=0.02,
            peak_device_mib=[5.0, 5.0],
            partition="flops",
            predicted_s=0.022,
            calibrated_s=0.022,
            predicted_mib=8.0,
        )
    ]
    # fmt: skip
    out, then = tmp_path / "plan.json", tmp_path / "then.json"
    out.write_text(json.dumps(dict(rows=rows, runs={}, plan_100_cells=None)))
    then.write_text(json.dumps(dict(rows=[_Row("mlp", 1, 0.01, 10.0)])))
    assert plan.main(["--rescore", f"--out={out}", f"--against={then}=the run before"]) == 0
    result = json.loads(out.read_text())
    assert result["summary"]["memory_err"]["most_below"] == -0.2
    assert result["repeat"] == [
        dict(model="mlp", rows=1, against="the run before", step_median=1.0, step_worst=1.0,
             memory_median=0.0, memory_worst=0.0)
    ]  # fmt: skip


def test_probes_are_taken_through_the_run_and_predictions_use_their_median():
    # With 9 rows: before rows 3 and 6 (the start and the end have probes of their own).
    assert [i for i in range(9) if plan._ProbeDue(i, 9)] == [3, 6]
    assert [i for i in range(2) if plan._ProbeDue(i, 2)] == [1]
    from lingpipe.pipeline.planning import cost_model, planner

    def Probe(flops, scale, backward=()):
        times = cost_model.CellTimes(
            forward=((0.0, scale), (1.0, 2 * scale)),
            backward_input=((0.0, scale),) * 2,
            backward_weight=((0.0, scale),) * 2,
            backward=backward,
        )
        rates = planner.Rates(flops_per_s=flops, action_s=1e-5, bytes_per_s=1e9, latency_s=0.0)
        return rates, planner.ModelCosts((1.0, 1.0), (4, 4), (8, 8), times)

    # One probe in a slow spell (half the rate, twice the times) moves nothing.
    slow = Probe(5e10, 2.0, backward=((0.0, 1.0), (0.0, 1.0)))
    rates, costs = plan.MedianProbe([Probe(1e11, 1.0), slow, Probe(1.1e11, 1.1)])
    assert rates.flops_per_s == 1e11 and rates.action_s == 1e-5
    assert costs.times.forward == ((0.0, 1.1), (1.0, 2.2))
    assert costs.times.backward == ()  # two of three probes found I + W apart faster
    assert costs.flops == (1.0, 1.0)


def test_merge_refuses_a_file_measured_with_other_threads(tmp_path, capsys, monkeypatch):
    # One table holds rows of one threading: a grid under TensorFlow's default threads
    # cannot be merged into one measured with a thread per device, nor the other way.
    measured = []
    monkeypatch.setattr(plan.common, "RunChild", lambda *a, **k: measured.append(a) or {})
    out = tmp_path / "plan.json"
    text = json.dumps(dict(rows=[], runs={}, threads="intra1_inter2"))
    out.write_text(text)
    assert plan.main(["--models=mlp", "--merge", "--threads=default", f"--out={out}"]) == 2
    assert "was measured with threads=intra1_inter2" in capsys.readouterr().err
    assert out.read_text() == text and not measured
