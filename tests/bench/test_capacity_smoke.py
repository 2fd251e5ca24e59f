"""bench/capacity.py's small CPU configuration: the table, its JSON, and that each
row's depth is the largest whose estimate fits the cap."""

import json

import pytest

from bench import capacity

MIB = 1024 * 1024


@pytest.mark.extended  # a benchmark's code path; bench/capacity.py ran on a GPU
def test_capacity_smoke_table(tmp_path, capsys):
    out = tmp_path / "capacity.json"
    assert capacity.main(["--size=smoke", "--measure_max_stages=1", f"--out={out}"]) == 0
    printed = capsys.readouterr().out
    assert "estimate-based (no GPU)" in printed and f"wrote {out}" in printed
    result = json.loads(out.read_text())
    assert result["mode"] == "estimate" and result["size"]["cap_mib"] == 32
    rows = result["rows"]
    assert [r["row"] for r in rows] == [name for name, *_ in capacity.ROWS]
    cfg, cap = result["size"], 32 * MIB
    for r in rows:
        k, m, remat, layers = r["stages"], r["micro_batches"], r["remat"], r["layers"]
        # The largest depth: it fits, one more layer does not.
        assert max(s.total for s in capacity.Estimate(cfg, layers, k, m, remat, 2)) <= cap
        assert max(s.total for s in capacity.Estimate(cfg, layers + 1, k, m, remat, 2)) > cap
        assert r["peak_stage_mib"] <= 32
    depths = [r["layers"] for r in rows]
    assert depths == sorted(depths) and depths[0] < depths[1] < depths[-1]
    assert rows[-1]["vs_naive"] == rows[-1]["params_m"] / rows[0]["params_m"] >= 8
    # The one-device rows were run on CPU, their peak beside the estimate of that step.
    for r in rows[:2]:
        assert r["measured_mib"] > 0
        assert r["est/measured"] == pytest.approx(r["estimate_mib"] / r["measured_mib"])
    assert "measured_mib" not in rows[2]
