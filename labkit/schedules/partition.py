"""Splitting a stack of layers into pipeline stages: by layer count or by measured cost.

What this teaches: a pipeline runs only as fast as its slowest stage. Giving every stage the
same NUMBER of layers is the natural first cut, but when layers cost different amounts the
stage that collects the expensive ones caps the whole line (the seed's four-GPU team got
1.2x from equal layer counts and 3.4x after balancing by measured cost). Balancing picks
contiguous stage boundaries that minimise the most expensive stage -- the classic "linear
partition" problem, solved exactly here by dynamic programming.

Pure Python (no torch): the supervisor imports this to validate configs.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from labkit.base.errors import ConfigError

Bounds = list[int]
"""Stage k holds layers ``bounds[k] .. bounds[k+1]-1``; ``len(bounds) == stages + 1``."""


def _check(layers: int, parts: int) -> None:
    if parts < 1 or layers < parts:
        raise ConfigError(
            f"cannot split {layers} layer(s) into {parts} stage(s): every stage needs at "
            f"least one layer (stages <= layers); e.g. layers={max(parts, 1) * 2}, "
            f"stages={max(parts, 1)}")


def bounds_by_count(layers: int, parts: int) -> Bounds:
    """Equal layer counts per stage; the first ``layers % parts`` stages get one extra."""
    _check(layers, parts)
    base, extra = divmod(layers, parts)
    bounds = [0]
    for k in range(parts):
        bounds.append(bounds[-1] + base + (1 if k < extra else 0))
    return bounds


def bounds_by_cost(costs: Sequence[float], parts: int) -> Bounds:
    """Contiguous split of ``costs`` into ``parts`` stages minimising the costliest stage.

    Ties are broken towards earlier boundaries, so the result is deterministic (every rank
    computes the same split from the same costs).
    """
    n = len(costs)
    _check(n, parts)
    if any(c < 0 for c in costs):
        raise ConfigError(f"layer costs ({list(costs)}) must all be >= 0; e.g. [1, 1, 4, 4]")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))
    inf = float("inf")
    # 1. best[k][i]: the smallest possible max-stage cost for layers 0..i-1 in k stages
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for i in range(k, n + 1):
            # 2. the last stage holds layers j..i-1; the first k-1 stages hold 0..j-1
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i] - 1e-12:
                    best[k][i], cut[k][i] = value, j
    # 3. walk the cuts back from the end
    bounds = [n]
    i = n
    for k in range(parts, 0, -1):
        i = cut[k][i]
        bounds.append(i)
    return bounds[::-1]


def stage_costs(costs: Sequence[float], bounds: Bounds) -> list[float]:
    """Total cost of each stage under ``bounds``."""
    return [float(sum(costs[a:b])) for a, b in itertools.pairwise(bounds)]
