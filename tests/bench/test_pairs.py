"""bench/pairs.py: two configurations timed in turn, the order alternating, a ratio per
round; a pick that is the best already is not timed."""

import pytest

from bench import pairs


class _Clock:
    """A perf_counter that each fake step moves on by its own seconds."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class _Step:
    def __init__(self, name, seconds, clock, calls):
        self.name, self.seconds, self.clock, self.calls = name, seconds, clock, calls

    def __call__(self):
        self.clock.now += self.seconds.pop(0) if isinstance(self.seconds, list) else self.seconds
        self.calls.append(self.name)
        return self

    def numpy(self):
        return 0.0


def test_a_duel_alternates_the_order_and_gives_the_median_of_the_rounds_ratios(monkeypatch):
    clock, calls = _Clock(), []
    monkeypatch.setattr(pairs.time, "perf_counter", clock)
    # Two untimed calls each, then 4 rounds of 2 steps; the second slows down in round 3.
    second = [1.0] * 2 + [2.0, 2.0, 2.0, 2.0, 5.0, 5.0, 2.0, 2.0]
    duel = pairs.Duel(_Step("a", 1.0, clock, calls), _Step("b", second, clock, calls), 4, 2)
    timed = calls[4:]
    assert calls[:4] == ["a", "b", "a", "b"]
    assert timed == ["a", "a", "b", "b", "b", "b", "a", "a"] * 2  # ab, ba, ab, ba
    assert duel["first_s"] == 1.0 and duel["second_s"] == 2.0
    assert (duel["ratio"], duel["ratio_min"], duel["ratio_max"]) == (2.0, 2.0, 5.0)


def test_a_pick_is_timed_against_the_best_and_one_that_is_the_best_is_not(monkeypatch):
    clock, calls = _Clock(), []
    monkeypatch.setattr(pairs.time, "perf_counter", clock)
    rows = [
        dict(model="mlp", R=1, K=2, M=m, schedule=s, v=1, remat="never", partition="flops",
             cells=[2, 2], calibrated_s=c, measured_s=t)
        for m, s, c, t in ((2, "1f1b", 0.04, 0.06), (2, "gpipe", 0.05, 0.04))
    ]  # fmt: skip
    picks = [
        dict(cap_mib=20.0, pick="R=1 K=2 M=2 1f1b never flops",
             best="R=1 K=2 M=2 gpipe never flops"),
        dict(cap_mib=30.0, pick="R=1 K=2 M=2 gpipe never flops",
             best="R=1 K=2 M=2 gpipe never flops"),
    ]  # fmt: skip
    seconds = {"1f1b": 1.0, "gpipe": 1.25}
    monkeypatch.setattr(
        pairs, "_Builder",
        lambda model: lambda row: _Step(row["schedule"], seconds[row["schedule"]], clock, calls),
    )  # fmt: skip
    timed, same = pairs.PickChild("mlp", picks, rows)
    assert timed["ratio"] == 1.25 and timed["pick_vs_best"] == pytest.approx(-0.2)
    assert timed["grid_ratio"] == pytest.approx(0.04 / 0.06)
    assert timed["predicted_ratio"] == pytest.approx(0.05 / 0.04)
    assert same["same"] and same["pick_vs_best"] == 0.0 and "first_s" not in same
    assert len(calls) == 4 + 2 * pairs.ROUNDS * pairs.STEPS  # the second pick never ran
