"""Stage partitioning: equal layer counts vs balanced by cost (the slowest stage)."""

from __future__ import annotations

import itertools

import pytest

from labkit.base.errors import ConfigError
from labkit.schedules.partition import bounds_by_cost, bounds_by_count, stage_costs

pytestmark = pytest.mark.lesson03


def test_bounds_by_count_spreads_the_remainder_first() -> None:
    assert bounds_by_count(8, 4) == [0, 2, 4, 6, 8]
    assert bounds_by_count(7, 3) == [0, 3, 5, 7]


def _brute_force(costs: list[float], parts: int) -> float:
    n = len(costs)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), parts - 1):
        b = [0, *cuts, n]
        best = min(best, max(stage_costs(costs, b)))
    return best


@pytest.mark.parametrize("costs, parts", [
    ([1, 1, 1, 1, 4, 4, 4, 4], 4), ([1, 1, 1, 6], 2), ([5, 1, 1, 1, 1, 1], 3),
    ([2, 3, 1, 4, 2, 2, 5, 1], 3), ([1, 1], 2)])
def test_bounds_by_cost_minimises_the_slowest_stage(costs: list[float], parts: int) -> None:
    """The DP split is optimal (checked by brute force) and contiguous."""
    bounds = bounds_by_cost(costs, parts)
    assert bounds[0] == 0 and bounds[-1] == len(costs) and len(bounds) == parts + 1
    assert all(a < b for a, b in itertools.pairwise(bounds))
    assert max(stage_costs(costs, bounds)) == pytest.approx(_brute_force(costs, parts))


def test_balancing_beats_equal_counts_on_uneven_layers() -> None:
    """The seed's story in miniature: equal counts leave one stage with the heavy layers."""
    costs = [1, 1, 1, 1, 4, 4, 4, 4]
    by_count = max(stage_costs(costs, bounds_by_count(8, 2)))
    by_cost = max(stage_costs(costs, bounds_by_cost(costs, 2)))
    assert (by_count, by_cost) == (16, 12)


def test_more_stages_than_layers_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"cannot split 3 layer\(s\) into 4 stage"):
        bounds_by_count(3, 4)
    with pytest.raises(ConfigError):
        bounds_by_cost([1, 1], 3)
