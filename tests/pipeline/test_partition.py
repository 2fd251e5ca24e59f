"""partition: exact min-max cuts, checked by brute force."""

import itertools
import random

import pytest

from lingpipe.pipeline.planning import partition


def _BruteForce(costs, k):
    n, best = len(costs), float("inf")
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = (0, *cuts, n)
        best = min(best, max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:])))
    return best


def _StageCosts(costs, counts):
    return [sum(costs[a:b]) for a, b in partition.Boundaries(counts)]


@pytest.mark.parametrize("trial", range(40))
def test_min_max_is_optimal_against_brute_force(trial):
    rng = random.Random(trial)
    n = rng.randint(1, 9)
    k = rng.randint(1, n)
    costs = [rng.choice([0, 1, 2, 3, 5, 8, 13, rng.random() * 10]) for _ in range(n)]
    counts = partition.MinMaxPartition(costs, k)
    assert len(counts) == k and all(c >= 1 for c in counts) and sum(counts) == n
    assert max(_StageCosts(costs, counts)) == pytest.approx(_BruteForce(costs, k))
    assert partition.MinMaxCost(costs, k) == pytest.approx(_BruteForce(costs, k))


def test_even_costs_split_evenly_with_extra_cells_first():
    assert partition.MinMaxPartition([1] * 10, 4) == [3, 3, 2, 2]
    assert partition.MinMaxPartition([1] * 8, 8) == [1] * 8
    assert partition.MinMaxPartition([7], 1) == [1]


def test_uneven_costs_isolate_the_heavy_cell():
    costs = [1, 1, 1, 10, 1, 1]
    counts = partition.MinMaxPartition(costs, 3)
    assert max(_StageCosts(costs, counts)) == 10


def test_beats_a_greedy_fill_to_the_mean():
    # Filling each stage up to total/K = 6.67 and closing it there gives
    # [4 | 4 | 4 1 1 1 1 4] with a worst stage of 12; the optimum is 8.
    costs = [4, 4, 4, 1, 1, 1, 1, 4]
    counts = partition.MinMaxPartition(costs, 3)
    assert max(_StageCosts(costs, counts)) == _BruteForce(costs, 3) == 8


def test_argument_errors():
    with pytest.raises(ValueError, match="cannot cut 2 cells into num_stages=3 non-empty stages"):
        partition.MinMaxPartition([1, 1], 3)
    with pytest.raises(ValueError, match="expected num_stages to be a positive integer"):
        partition.MinMaxPartition([1, 1], 0)
    with pytest.raises(ValueError, match="cell costs must be non-negative"):
        partition.MinMaxPartition([1, -1], 1)


def test_explicit_counts_are_checked():
    assert partition.CheckCounts((2, 1), 3, 2) == [2, 1]
    with pytest.raises(ValueError, match=r"\[2, 2\] adds up to 4 cells, but cell_tpl has 3"):
        partition.CheckCounts([2, 2], 3, 2)
    with pytest.raises(ValueError, match=r"\[3\] has 1 stage\(s\), expected num_stages=2"):
        partition.CheckCounts([3], 3, 2)
    with pytest.raises(ValueError, match="every stage needs a positive number of cells"):
        partition.CheckCounts([3, 0], 3, 2)
    assert partition.Boundaries([3, 1, 2]) == [(0, 3), (3, 4), (4, 6)]
