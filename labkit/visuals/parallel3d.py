"""Figures for lesson 09: the rank grid, traffic per axis and memory per rank, measured vs
predicted.

* ``plot_grid``: the ranks of a dp x pp x tp grid as boxes, tensor-parallel groups boxed
  together (neighbouring ranks: one node), pipeline stages left to right, data replicas
  top to bottom;
* ``plot_axis_traffic``: wire bytes per step on each axis, measured (bars) beside
  ``labkit.theory.parallel_layout`` (black outline);
* ``plot_rank_memory``: each rank's model state, measured vs predicted, stacked by term.
All return a matplotlib ``Figure`` and never call ``plt.show()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from labkit.analysis.plots import AXIS_COLORS, new_figure
from labkit.visuals.axes import rank_ticks
from labkit.visuals.memory import TERM_COLORS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from labkit.base.grid import Grid


def plot_grid(grid: Grid, title: str | None = None) -> Figure:
    """Every rank at (pipeline stage, data replica); a TP group is one box of ranks."""
    from matplotlib.patches import FancyBboxPatch, Rectangle

    fig = new_figure((1.8 + 1.9 * grid.pp * grid.tp ** 0.5, 1.2 + 1.1 * grid.dp))
    ax = fig.add_subplot(1, 1, 1)
    w = 1.0 / grid.tp
    for r in range(grid.world_size):
        c = grid.coords(r)
        x, y = c.pp + c.tp * w, grid.dp - 1 - c.dp
        ax.add_patch(Rectangle((x + 0.04, y + 0.15), w - 0.08, 0.7, facecolor="#DCE9F8",
                               edgecolor="#4C9BE8"))
        ax.text(x + w / 2, y + 0.5, f"rank {r}\ndp{c.dp} pp{c.pp} tp{c.tp}", ha="center",
                va="center", fontsize=7)
    for dp in range(grid.dp):
        for pp in range(grid.pp):
            ax.add_patch(FancyBboxPatch((pp + 0.01, grid.dp - 1 - dp + 0.08), 0.98, 0.84,
                                        boxstyle="round,pad=0.01", fill=False,
                                        edgecolor=AXIS_COLORS["tp"], linewidth=1.5))
    ax.set_xlim(0, grid.pp)
    ax.set_ylim(0, grid.dp)
    ax.set_xticks([p + 0.5 for p in range(grid.pp)], [f"stage {p}" for p in range(grid.pp)])
    ax.set_yticks([grid.dp - 1 - d + 0.5 for d in range(grid.dp)],
                  [f"replica {d}" for d in range(grid.dp)])
    ax.set_title(title or f"{grid}: green boxes are tensor-parallel groups (one node each)",
                 fontsize=9)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def plot_axis_traffic(results: dict[str, Any]) -> Figure:
    """Measured wire bytes per step on each axis (bars) and the prediction (outlines),
    one group of bars per run."""
    fig = new_figure((8, 3.6))
    ax = fig.add_subplot(1, 1, 1)
    labels = list(results)
    width = 0.25
    for i, axis in enumerate(("dp", "pp", "tp")):
        xs = [k + (i - 1) * width for k in range(len(labels))]
        got = [results[lbl].metrics["comm_bytes_per_axis"][axis] / 1e6 for lbl in labels]
        want = [results[lbl].metrics["predicted_comm_bytes_per_axis"][axis] / 1e6
                for lbl in labels]
        ax.bar(xs, got, width, color=AXIS_COLORS[axis], label=f"{axis} measured")
        ax.bar(xs, want, width, fill=False, edgecolor="black", linewidth=1.2,
               label="predicted" if i == 0 else None)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel("MB on the wire per step (all ranks)")
    ax.set_title("Traffic per axis: measured from the trace vs labkit.theory.parallel_layout")
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def rank_grid_labels(metrics: dict[str, Any], ranks: int) -> list[str]:
    """"rank 3" over its coordinates on the grid's active axes ("pp1 tp1")."""
    from labkit.base.grid import Grid

    grid = metrics.get("grid") or {}
    g = Grid(**{a: int(grid.get(a, 1)) for a in ("dp", "pp", "tp", "cp", "ep")})
    active = [a for a in ("dp", "pp", "cp", "tp", "ep") if grid.get(a, 1) > 1]
    if not active or g.world_size != ranks:
        return [f"rank {r}" for r in range(ranks)]
    return [f"rank {r}\n" + " ".join(f"{a}{g.coords(r)[a]}" for a in active)
            for r in range(ranks)]


def plot_rank_memory(result: Any) -> Figure:
    """Each rank's model state (params, grads, optimizer), measured vs predicted; one tick
    per rank, named by its grid coordinates."""
    m = result.metrics
    fig = new_figure((8, 3.6))
    ax = fig.add_subplot(1, 1, 1)
    terms = ("params", "grads", "optimizer")
    for rank, (got, want) in enumerate(zip(m["per_rank_bytes"], m["predicted_bytes"])):
        bottom = 0.0
        for term in terms:
            ax.bar(rank, got[term] / 1e6, 0.6, bottom=bottom, color=TERM_COLORS[term],
                   label=f"{term} (measured)" if rank == 0 else None)
            bottom += got[term] / 1e6
        ax.bar(rank, sum(want[t] for t in terms) / 1e6, 0.6, fill=False, edgecolor="black",
               linewidth=1.2, label="predicted total" if rank == 0 else None)
    n = len(m["per_rank_bytes"])
    rank_ticks(ax, range(n), rank_grid_labels(m, n))
    ax.set_xlabel("rank (grid coordinates)")
    ax.set_ylabel("model state (MB)")
    ax.set_title("Memory per rank: what each rank keeps between steps")
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig
