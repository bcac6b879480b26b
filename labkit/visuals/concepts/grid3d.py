"""The 3D grid before any run: every rank of a dp x pp x tp layout, coloured by its groups.

Teaches the picture behind lesson 09 (Narayanan et al. 2021, "Efficient Large-Scale Language
Model Training on GPU Clusters Using Megatron-LM", figure 3; picotron's
``arange(world).view(dp, pp, tp)``): ranks numbered with tp fastest, so

* a **tensor-parallel group** (green box) is ``tp`` neighbouring ranks that split every
  block's matrices and all-reduce activations inside every block -- one node's fast links;
* a **pipeline group** (purple arrows) is the ranks holding consecutive stages: activations
  go forward, gradients back, once per microbatch per cut;
* a **data-parallel group** (red dashed lines) is the replicas of one slice, which average
  gradients once per step.

Every number on the picture comes from ``labkit.theory.parallel_layout`` for the layout the
lesson passes: parameters per rank by stage, and each axis' messages and wire bytes per step.
Returns a matplotlib ``Figure``; never calls ``plt.show()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from labkit.analysis.plots import AXIS_COLORS, new_figure
from labkit.visuals.axes import fmt_bytes

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from labkit.theory.parallel3d import Layout3D

BOX_W, BOX_H = 0.9, 0.75
"""A rank's box (data units); a tp group's ranks sit side by side, one unit apart."""
GAP_X, ROW_H = 1.1, 1.9
"""Space between pipeline stages, and the height of one data replica's row."""


def _stage_x(layout: Layout3D, stage: int) -> float:
    return stage * (layout.tp + GAP_X)


def _box_xy(layout: Layout3D, dp: int, pp: int, tp: int) -> tuple[float, float]:
    """Lower-left corner of a rank's box: stages left to right, replica 0 on top."""
    return _stage_x(layout, pp) + tp + (1 - BOX_W) / 2, (layout.dp - 1 - dp) * ROW_H


def _stage_label(layout: Layout3D, stage: int) -> str:
    first, last = layout.bounds[stage], layout.bounds[stage + 1] - 1
    blocks = f"block {first}" if first == last else f"blocks {first}-{last}"
    extra = (" + embedding" if stage == 0 else "") + (" + head" if stage == layout.pp - 1 else "")
    return f"stage {stage}: {blocks}{extra}"


def _legend(layout: Layout3D) -> list[tuple[str, bool, str]]:
    """(axis, dashed, label) per axis: the busiest rank's messages per step and the
    wire bytes of a step over all ranks."""
    t, calls = layout.traffic, layout.calls
    return [("tp", False, f"tp group of {layout.tp}: all-reduce activations inside every block "
                        f"({calls.get('tp', 0)} a step per rank; {fmt_bytes(t['tp'])} a step in all)"),
            ("pp", False, f"pp group of {layout.pp}: activations forward, gradients back "
                        f"({calls.get('pp', 0)} messages a step per rank; {fmt_bytes(t['pp'])} in all)"),
            ("dp", True, f"dp group of {layout.dp}: average the gradients "
                         f"({calls.get('dp', 0)} all-reduce a step; {fmt_bytes(t['dp'])} in all)")]


def _draw_groups(ax: Axes, layout: Layout3D) -> None:
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    d_n, p_n, t_n = layout.dp, layout.pp, layout.tp
    for d in range(d_n):
        for p in range(p_n):
            x, y = _box_xy(layout, d, p, 0)
            box = FancyBboxPatch((x - 0.08, y - 0.1), t_n - 1 + BOX_W + 0.16, BOX_H + 0.2,
                                 boxstyle="round,pad=0.02", fill=False, linewidth=2,
                                 edgecolor=AXIS_COLORS["tp"], gid="tp group")
            ax.add_patch(box)
            for t in range(t_n):
                x, y = _box_xy(layout, d, p, t)
                if p + 1 < p_n:  # to the same tp slice of the next stage, over the boxes
                    x2, _ = _box_xy(layout, d, p + 1, t)
                    ax.add_patch(FancyArrowPatch(
                        (x + BOX_W / 2, y + BOX_H), (x2 + BOX_W / 2, y + BOX_H),
                        connectionstyle=f"arc3,rad={-0.22 - 0.08 * t}", arrowstyle="-|>",
                        mutation_scale=10, color=AXIS_COLORS["pp"], linewidth=1.3, gid="pp link"))
                if d + 1 < d_n:  # to the same slice of the next replica, straight down
                    _, y2 = _box_xy(layout, d + 1, p, t)
                    ax.plot([x + BOX_W / 2] * 2, [y, y2 + BOX_H], linestyle="--", linewidth=1.3,
                            color=AXIS_COLORS["dp"], gid="dp link")


def plot_grid3d(layout: Layout3D, title: str | None = None) -> Figure:
    """Every rank of ``layout``'s grid as a box (its rank, coordinates and parameters), its
    tensor-parallel groups boxed, its pipeline and data-parallel groups linked; the legend
    gives each axis' traffic per step from the same layout."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    d_n, p_n, t_n = layout.dp, layout.pp, layout.tp
    width = _stage_x(layout, p_n - 1) + t_n
    fig = new_figure((max(6.0, 1.3 * width + 1.0), 1.9 + 1.25 * d_n))
    ax = fig.add_subplot(1, 1, 1)
    for rank in range(layout.world_size):
        d, rest = divmod(rank, p_n * t_n)
        p, t = divmod(rest, t_n)
        x, y = _box_xy(layout, d, p, t)
        ax.add_patch(Rectangle((x, y), BOX_W, BOX_H, facecolor="#EEF5EC", edgecolor="#555555",
                               linewidth=0.8, gid=f"rank {rank}"))
        ax.text(x + BOX_W / 2, y + BOX_H / 2,
                f"rank {rank}\ndp{d} pp{p} tp{t}\n{layout.params_per_rank[p]:,} params",
                ha="center", va="center", fontsize=6.5)
    _draw_groups(ax, layout)
    for p in range(p_n):
        ax.text(_stage_x(layout, p) + t_n / 2, -0.45, _stage_label(layout, p), ha="center",
                va="top", fontsize=7.5)
    for d in range(d_n):
        ax.text(-0.25, (d_n - 1 - d) * ROW_H + BOX_H / 2, f"replica {d}", ha="right",
                va="center", fontsize=7.5)
    handles = [Line2D([], [], color=AXIS_COLORS[a], linestyle="--" if dashed else "-", linewidth=2,
                      label=label) for a, dashed, label in _legend(layout)]
    ax.legend(handles=handles, fontsize=7, frameon=False, loc="upper center",
              bbox_to_anchor=(0.5, -0.02), ncol=1)
    ax.set_xlim(-1.4, width + 0.3)
    ax.set_ylim(-1.0, (d_n - 1) * ROW_H + BOX_H + 0.9)
    ax.set_axis_off()
    ax.set_title(title or f"dp{d_n} x pp{p_n} x tp{t_n} = {layout.world_size} ranks: "
                          f"each axis is a group that talks on its own", fontsize=9)
    fig.tight_layout()
    return fig
