"""Lesson 04's picture before its first run: Megatron's split, read from the Figure's artists."""

from __future__ import annotations

import pytest
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from labkit.base.errors import ConfigError
from labkit.visuals.concepts.tensor_parallel import OTHER, plot_tp_split

pytestmark = pytest.mark.lesson04


def _patches(fig: Figure, gid: str) -> list:
    return [p for p in fig.axes[0].patches if p.get_gid() == gid]


def _texts(fig: Figure) -> list[str]:
    return [t.get_text() for t in fig.axes[0].texts]


def test_the_lessons_shapes_on_two_ranks() -> None:
    """tokens = b·s = 128, h = 512, t = 2: every rank's slices carry their shapes (A_r
    [h, 4h/t], Y_r [tokens, 4h/t], B_r [4h/t, h], a partial Z_r [tokens, h]), X and Z are
    whole, and f and g each appear once."""
    fig = plot_tp_split(128, 512, 2)
    texts = _texts(fig)
    for r in range(2):
        assert f"A_{r} [512, 1024]\ncolumns {r} of A" in texts
        assert f"B_{r} [1024, 512]\nrows {r} of B" in texts
        assert f"Y_{r} [128, 1024]" in texts
        assert f"Z_{r} [128, 512]\npartial" in texts
        assert f"rank {r}" in texts
    assert "X [128, 512]" in texts and "Z = Σ Z_r [128, 512]" in texts
    assert len(_patches(fig, "f")) == 1 and len(_patches(fig, "g")) == 1
    assert "fwd: identity\nbwd: all-reduce dX" in texts  # f
    assert "fwd: all-reduce Σ Z_r\nbwd: identity" in texts  # g
    assert "A [512, 2048] split by columns, B [2048, 512] by rows" in fig.axes[0].get_title()


@pytest.mark.parametrize("ranks", [2, 4])
def test_each_rank_keeps_one_stripe_of_A_by_columns_and_of_B_by_rows(ranks: int) -> None:
    """Every rank's copy of A is cut into t stripes side by side (columns) and of B into t
    stripes one above the other (rows); exactly one stripe per rank is coloured, a different
    one on each rank."""
    fig = plot_tp_split(64, 256, ranks)
    for name, by_columns in (("A", True), ("B", False)):
        stripes = _patches(fig, f"{name} slice")
        assert len(stripes) == ranks * ranks
        kept = []
        for r in range(ranks):
            mine = stripes[r * ranks:(r + 1) * ranks]
            coloured = [k for k, p in enumerate(mine) if to_hex(p.get_facecolor()) != OTHER.lower()]
            assert len(coloured) == 1, (name, r, coloured)
            kept.append(coloured[0])
            widths = {round(p.get_width(), 6) for p in mine}
            heights = {round(p.get_height(), 6) for p in mine}
            xs = {round(p.get_x(), 6) for p in mine}
            assert (len(xs) == ranks) == by_columns and len(widths) == len(heights) == 1
        assert kept == list(range(ranks)), (name, kept)
    assert len(_patches(fig, "Z partial")) == ranks and len(_patches(fig, "Z")) == 1


@pytest.mark.parametrize("args", [(0, 512, 2), (128, 512, 0), (128, 5, 3)])
def test_bad_shapes_name_the_value_and_rule(args: tuple[int, int, int]) -> None:
    with pytest.raises(ConfigError, match="must be"):
        plot_tp_split(*args)
