"""Lesson 01's data-parallel diagram: N shards of B samples, N replicas, every gradient into
one average and the same update back to every replica."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from labkit.visuals.concepts.data_parallel import mean_formula, plot_data_parallel

pytestmark = pytest.mark.lesson01


def _gids(fig, kind):
    return sorted(p.get_gid() for p in fig.axes[0].patches if isinstance(p, kind))


@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_one_shard_one_replica_three_arrows_per_rank(n: int) -> None:
    fig = plot_data_parallel(n, 32)
    boxes = _gids(fig, FancyBboxPatch)
    assert boxes == sorted([f"shard {r}" for r in range(n)] + [f"replica {r}" for r in range(n)]
                           + ["average"])
    arrows = _gids(fig, FancyArrowPatch)
    assert arrows == sorted(f"{k} {r}" for k in ("feed", "grad", "update") for r in range(n))


def test_the_shards_tile_the_global_batch() -> None:
    """Rank r's shard is samples r*B .. (r+1)*B-1: 3 x 32 tiles 0..95, the title says 96."""
    texts = [t.get_text() for t in plot_data_parallel(3, 32).axes[0].texts]
    assert "global batch: 3 x 32 = 96 samples" in texts
    for r, span in enumerate(("0..31", "32..63", "64..95")):
        assert f"shard {r}: samples\n{span}" in texts
    assert any("(g0 + g1 + g2) / 3" in t for t in texts)


def test_mean_formula_and_bad_sizes() -> None:
    assert mean_formula(2) == "(g0 + g1) / 2"
    assert mean_formula(8) == "(g0 + ... + g7) / 8"
    with pytest.raises(ValueError, match="must be >= 1"):
        plot_data_parallel(0)
