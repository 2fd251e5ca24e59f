"""schedule: GPipe fill-drain ticks."""

from lingpipe.pipeline import schedule


def test_fill_drain_ticks():
    ticks = schedule.FillDrain(3, 4)
    assert len(ticks) == 3 + 4 - 1
    assert ticks[0] == [(0, 0)]
    assert ticks[2] == [(0, 2), (1, 1), (2, 0)]
    assert ticks[-1] == [(2, 3)]
    # Every (stage, micro-batch) runs once; stage k runs micro-batch m at tick k + m.
    flat = [km for tick in ticks for km in tick]
    assert sorted(flat) == [(k, m) for k in range(3) for m in range(4)]
    assert all((k, m) in ticks[k + m] for k, m in flat)


def test_backward_mirrors_forward():
    back = schedule.BackwardTicks(2, 3)
    assert back[0] == [(1, 2)]
    assert back[-1] == [(0, 0)]
    flat = [km for tick in back for km in tick]
    per_stage = {k: [m for kk, m in flat if kk == k] for k in range(2)}
    assert per_stage == {0: [2, 1, 0], 1: [2, 1, 0]}


def test_bubble_fraction():
    assert schedule.BubbleFraction(1, 8) == 0.0
    assert schedule.BubbleFraction(4, 1) == 0.75
    assert abs(schedule.BubbleFraction(4, 32) - 3 / 35) < 1e-12
