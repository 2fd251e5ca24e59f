"""bench/gpu_parts.py's side-by-side timing: figures reported as they grow (a part stopped
at its budget keeps them), each step's rounds, and steps skipped when the budget is near
or run out of memory."""

import json

import tensorflow as tf

from bench import gpu_parts


def _Step(calls, name, error=None):
    def Step():
        calls.append(name)
        if error:
            raise error
        return (tf.constant(1.0), tf.constant(2.0))

    return Step


def _Lines(capsys):
    return [json.loads(x) for x in capsys.readouterr().out.splitlines()]


def test_side_by_side_reports_as_it_goes_and_ends_with_every_round(capsys):
    calls, reports = [], []
    steps = {name: (_Step(calls, name), ()) for name in ("plain", "gpipe", "1f1b")}
    gpu_parts.TimeSideBySide(steps, 3, budget_s=600, report=lambda *r: reports.append(r))
    # Two untimed runs each, then a round of all that are ready after each one.
    assert calls[:9] == ["plain"] * 3 + ["gpipe"] * 2 + ["plain", "gpipe"] + ["1f1b"] * 2
    assert [sorted(ms) for ms, _ in reports[:3]] == [
        ["plain"], ["gpipe", "plain"], ["1f1b", "gpipe", "plain"]
    ]  # fmt: skip
    # Then rounds until the last has 3: the first ones, timed all along, have more.
    ms, rounds = reports[-1]
    assert rounds == {"plain": 5, "gpipe": 4, "1f1b": 3} and all(v > 0 for v in ms.values())
    setup = _Lines(capsys)
    assert [x["config"] for x in setup] == ["plain", "gpipe", "1f1b"]
    assert {x["kind"] for x in setup} == {"setup"}


def test_a_step_out_of_memory_or_past_the_budget_is_a_row(capsys):
    calls, reports = [], []
    oom = tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor\nmore")
    steps = {"plain": (_Step(calls, "plain"), ()), "big": (_Step(calls, "big", oom), ())}
    gpu_parts.TimeSideBySide(steps, 2, budget_s=600, report=lambda *r: reports.append(r))
    lines = _Lines(capsys)
    assert {"kind": "row", "config": "big", "oom": "more"} in lines
    assert set(reports[-1][0]) == {"plain"}
    gpu_parts.TimeSideBySide(steps, 2, budget_s=0, report=lambda *r: reports.append(r))
    skipped = [x for x in _Lines(capsys) if "skipped" in x]
    assert [x["config"] for x in skipped] == ["plain", "big"]
    assert skipped[0]["skipped"] == "not run: the part's time budget was near"
