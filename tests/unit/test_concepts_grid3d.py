"""Lesson 09's grid diagram draws every rank where the grid puts it, one box per tensor-parallel
group, a link per pipeline and data-parallel neighbour pair, and the layout's own numbers."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

from labkit.analysis.plots import AXIS_COLORS
from labkit.base.grid import Grid
from labkit.theory import parallel_layout
from labkit.visuals.concepts.grid3d import plot_grid3d

pytestmark = pytest.mark.lesson09


def _layout(dp: int, pp: int, tp: int):
    return parallel_layout(kind="gpt", width=64, depth=4, heads=4, seq_len=32, vocab=96,
                           dp=dp, pp=pp, tp=tp, microbatches=2, batch_size=8,
                           optimizer="momentum")


def _by_gid(fig, kind, prefix):
    ax = fig.axes[0]
    artists = ax.patches if kind == "patch" else ax.lines
    return [a for a in artists if (a.get_gid() or "").startswith(prefix)]


@pytest.mark.parametrize("dims", [(2, 2, 2), (1, 2, 2), (2, 1, 2), (3, 2, 1)])
def test_every_rank_once_and_every_group_link_counted(dims) -> None:
    """dp x pp x tp rank boxes; dp x pp tp-group boxes; dp x tp x (pp-1) pipeline arrows and
    pp x tp x (dp-1) data-parallel links, each in its axis' colour."""
    dp, pp, tp = dims
    fig = plot_grid3d(_layout(dp, pp, tp))
    ranks = _by_gid(fig, "patch", "rank ")
    assert sorted(int(b.get_gid().split()[1]) for b in ranks) == list(range(dp * pp * tp))
    assert all(isinstance(b, Rectangle) for b in ranks)
    groups = _by_gid(fig, "patch", "tp group")
    assert len(groups) == dp * pp and all(isinstance(g, FancyBboxPatch) for g in groups)
    arrows = _by_gid(fig, "patch", "pp link")
    assert len(arrows) == dp * tp * (pp - 1) and all(isinstance(a, FancyArrowPatch) for a in arrows)
    links = _by_gid(fig, "line", "dp link")
    assert len(links) == pp * tp * (dp - 1)
    assert {g.get_edgecolor()[:3] for g in groups} <= {matplotlib.colors.to_rgb(AXIS_COLORS["tp"])}
    assert all(ln.get_color() == AXIS_COLORS["dp"] for ln in links)


def test_each_rank_is_labelled_with_the_grid_coordinates_and_its_stage_parameters() -> None:
    """The text in rank r's box is labkit's Grid.coords(r) and parallel_layout's parameters
    for its stage; ranks of one tp group sit side by side, the next stage to their right,
    the next replica below."""
    lay = _layout(2, 2, 2)
    grid = Grid(dp=2, pp=2, tp=2)
    fig = plot_grid3d(lay)
    texts = [t.get_text() for t in fig.axes[0].texts]
    for r in range(8):
        c = grid.coords(r)
        want = f"rank {r}\ndp{c.dp} pp{c.pp} tp{c.tp}\n{lay.params_per_rank[c.pp]:,} params"
        assert want in texts, want
    boxes = {int(b.get_gid().split()[1]): b.get_xy() for b in _by_gid(fig, "patch", "rank ")}
    assert boxes[1][0] > boxes[0][0] and boxes[1][1] == boxes[0][1]  # tp: side by side
    assert boxes[2][0] > boxes[1][0] and boxes[2][1] == boxes[0][1]  # pp: to the right
    assert boxes[4][1] < boxes[0][1] and boxes[4][0] == boxes[0][0]  # dp: below
    assert "stage 0: blocks 0-1 + embedding" in texts and "stage 1: blocks 2-3 + head" in texts


def test_the_legend_carries_the_layouts_traffic_per_axis() -> None:
    """Each axis' legend entry names its group size, the busiest rank's messages per step and
    the wire bytes of a step from parallel_layout (dp2 x pp2 x tp2: 16 TP all-reduces)."""
    lay = _layout(2, 2, 2)
    labels = [t.get_text() for t in plot_grid3d(lay).axes[0].get_legend().get_texts()]
    assert len(labels) == 3
    tp, pp, dp = labels
    assert tp.startswith("tp group of 2") and "16 a step per rank" in tp and "4.19 MB" in tp
    assert pp.startswith("pp group of 2") and f"{lay.calls['pp']} messages" in pp and "524 KB" in pp
    assert dp.startswith("dp group of 2") and "1.84 MB" in dp
