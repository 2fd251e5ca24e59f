"""Cutting a sequence of cells into contiguous pipeline stages."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from typing import Any

__all__ = [
    "Boundaries",
    "CheckCounts",
    "Counts",
    "MinMaxCost",
    "MinMaxPartition",
]

# Relative slack when comparing sums of float costs.
_EPS = 1e-9


def _Prefix(costs: Sequence[float]) -> list[float]:
    return list(itertools.accumulate(map(float, costs), initial=0.0))


def MinMaxCost(costs: Sequence[float], num_stages: int) -> float:
    """The smallest possible cost of the most expensive stage (dynamic programming)."""
    if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
        raise ValueError(f"expected num_stages to be a positive integer, received {num_stages!r}")
    if num_stages > len(costs):
        raise ValueError(
            f"cannot cut {len(costs)} cells into num_stages={num_stages} non-empty stages; "
            f"expected num_stages <= number of cells"
        )
    if not all(c >= 0 for c in costs):
        raise ValueError(f"cell costs must be non-negative numbers, received {list(costs)}")
    prefix = _Prefix(costs)
    # best[i]: min over cuts of cells[:i] into k stages of the max stage cost (k = 1 first).
    best = [float("inf")] + prefix[1:]
    for k in range(2, num_stages + 1):
        best = [float("inf")] * k + [
            min(max(best[j], prefix[i] - prefix[j]) for j in range(k - 1, i))
            for i in range(k, len(costs) + 1)
        ]
    return best[-1]


def MinMaxPartition(costs: Sequence[float], num_stages: int) -> list[int]:
    """Cell counts per stage of a cut of `costs` into `num_stages` contiguous, non-empty
    stages whose most expensive stage (it sets the pipeline's clock) is as cheap as any
    such cut allows (exact); among those, the most even one: the least sum of squared
    stage costs (a second dynamic program under the bound); ties put the extra cells on
    earlier stages, as micro-batch sizes do.

    Remembered per (costs, num_stages): the planner asks again for every candidate of
    the same stage count, and the programs are O(cells^2 x stages)."""
    if isinstance(num_stages, int) and all(isinstance(c, (int, float)) for c in costs):
        return list(_CachedMinMaxPartition(tuple(map(float, costs)), num_stages))
    return _MinMaxPartition(costs, num_stages)


@functools.lru_cache(maxsize=256)
def _CachedMinMaxPartition(costs: tuple[float, ...], num_stages: int) -> tuple[int, ...]:
    return tuple(_MinMaxPartition(costs, num_stages))


def _MinMaxPartition(costs: Sequence[float], num_stages: int) -> list[int]:
    bound = MinMaxCost(costs, num_stages)
    slack = bound * (1 + _EPS) + _EPS
    prefix = _Prefix(costs)
    n, inf = len(costs), float("inf")
    # sq[k][i]: least sum of squares cutting cells[:i] into k stages within the bound.
    sq = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    back = [[0] * (n + 1) for _ in range(num_stages + 1)]
    sq[0][0] = 0.0
    for k in range(1, num_stages + 1):
        for i in range(k, n - (num_stages - k) + 1):
            for j in range(k - 1, i):
                stage = prefix[i] - prefix[j]
                if stage <= slack and sq[k - 1][j] + stage * stage <= sq[k][i]:
                    sq[k][i], back[k][i] = sq[k - 1][j] + stage * stage, j
    counts, i = [], n
    for k in range(num_stages, 0, -1):
        counts.append(i - back[k][i])
        i = back[k][i]
    return counts[::-1]


def CheckCounts(
    counts: Sequence[int],
    num_cells: int,
    num_stages: int,
    units: tuple[str, str] = ("cells", "cell_tpl"),
) -> list[int]:
    """Validates an explicit partition (cell counts per stage) and returns it as a list;
    `units` names what is counted and what holds them (a Keras graph's layer calls)."""
    counts = list(counts)
    if len(counts) != num_stages:
        raise ValueError(
            f"explicit partition {counts} has {len(counts)} stage(s), expected "
            f"num_stages={num_stages}"
        )
    if any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in counts):
        raise ValueError(
            f"explicit partition {counts}: every stage needs a positive number of cells"
        )
    if sum(counts) != num_cells:
        raise ValueError(
            f"explicit partition {counts} adds up to {sum(counts)} {units[0]}, but "
            f"{units[1]} has {num_cells}"
        )
    return counts


def Counts(
    partition: Any,
    costs: Sequence[float],
    num_stages: int,
    units: tuple[str, str] = ("cells", "cell_tpl"),
) -> list[int]:
    """Units per stage, as both front ends cut: a policy's name (a str) balances `costs`
    (MinMaxPartition); a list of counts is checked (CheckCounts, naming `units`) and
    kept."""
    if isinstance(partition, str):
        return MinMaxPartition(costs, num_stages)
    return CheckCounts(partition, len(costs), num_stages, units)


def Boundaries(counts: Sequence[int]) -> list[tuple[int, int]]:
    """[(first_cell, end_cell), ...] per stage from cell counts."""
    ends = itertools.accumulate(counts)
    return [(end - c, end) for c, end in zip(counts, ends)]
