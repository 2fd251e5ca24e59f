"""bench/memory.py --rescore: the estimate's columns written again from the code, the
measured ones kept, nothing run."""

import json

import pytest

from bench import common
from bench import memory as bench_memory


def test_rescore_writes_the_estimate_again_and_keeps_what_was_measured(tmp_path, monkeypatch):
    # This process has its devices already (tests/conftest.py); the script's Setup would
    # make them.
    monkeypatch.setattr(common, "Setup", lambda *args, **kwargs: None)
    measured = {
        "model": "mlp", "schedule": "1f1b", "stages": 2, "micro_batches": 4,
        "remat": "always", "dtype": "float32", "peak_mib": 64.0, "step_mib": 40.0,
    }  # fmt: skip
    stale = {"estimate_mib": -1.0, "est/peak": -1.0, "est_device_mib": -1.0, "sim_alive": "?"}
    plain = {"model": "mlp", "schedule": "gpipe (tape)", "stages": "plain", "peak_mib": 9.0}
    path = tmp_path / "memory.json"
    path.write_text(json.dumps({"date": "then", "rows": [measured | stale, plain]}))

    bench_memory.Rescore(str(path))

    written = json.loads(path.read_text())
    row, kept = written["rows"]
    assert kept == plain  # a plain model's row has no estimate
    assert {k: row[k] for k in measured} == measured
    layer = common.Build("mlp", 2, 4, "always", "1f1b")
    want = bench_memory.Estimate(layer, common.Inputs("mlp"), 64.0 * bench_memory.MIB)
    assert {k: row[k] for k in stale} == pytest.approx(want)
    assert row["estimate_mib"] > 0 and row["sim_alive"] == "2/1"
    assert written["rescored"].startswith("estimate columns written again")
