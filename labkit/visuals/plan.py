"""Figures for lesson 13 and the planner widget: where a layout's memory and time go.

Teaches a layout's cost as a sum of named terms (``labkit.theory.plan.Prediction.memory``
and ``.time``): one stacked bar per layout, memory per GPU in GB against the GPU's capacity,
and the step in seconds split into compute, recomputation, tensor-parallel collectives, the
pipeline bubble, p2p and the exposed data-parallel reduction. The planner's own terms are
drawn; nothing is recomputed here. Returns a matplotlib ``Figure``, never calls
``plt.show()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from labkit.analysis.plots import AXIS_COLORS, new_figure
from labkit.visuals.memory import TERM_COLORS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from labkit.theory.plan import Prediction

MEMORY_COLORS = {**TERM_COLORS, "logits": "#EDC948", "buffers": "#9C755F", "reserve": "#BAB0AC"}
TIME_COLORS = {"compute": "#4C9BE8", "recompute": "#A0CBE8", "tp": AXIS_COLORS["tp"],
               "bubble": "#BAB0AC", "p2p": AXIS_COLORS["pp"], "dp": AXIS_COLORS["dp"]}


def plot_plan_breakdown(preds: dict[str, Prediction], title: str = "") -> Figure:
    """Two panels, one bar per named layout: memory per GPU (GB, stacked by term, the GPU's
    capacity dashed) and step time (s, stacked by term). A layout that does not fit is
    hatched on the memory panel."""
    names = list(preds)
    fig = new_figure((max(7.0, 1.9 * len(names) + 3.0), 4.2))
    mem_ax, time_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for ax, kind, colors, scale, unit in ((mem_ax, "memory", MEMORY_COLORS, 1e9, "GB per GPU"),
                                         (time_ax, "time", TIME_COLORS, 1.0, "step time (s)")):
        for x, name in enumerate(names):
            q = preds[name]
            bottom = 0.0
            for term in getattr(q, kind):
                if term.value <= 0:
                    continue
                height = term.value / scale
                ax.bar(x, height, bottom=bottom, color=colors.get(term.name, "#777777"),
                       label=term.name, hatch="//" if kind == "memory" and not q.fits else None,
                       edgecolor="white", linewidth=0.5)
                bottom += height
        ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel(unit)
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles, strict=True))
        ax.legend(unique.values(), unique.keys(), fontsize=7, loc="upper left")
    capacity = {q.capacity_bytes for q in preds.values()}
    for cap in capacity:
        mem_ax.axhline(cap / 1e9, color="black", linestyle="--", linewidth=1)
        mem_ax.text(len(names) - 0.5, cap / 1e9, f" {cap / 1e9:.0f} GB", va="bottom", ha="right",
                    fontsize=8)
    mem_ax.set_title("memory per GPU", fontsize=10)
    time_ax.set_title("one step, by term", fontsize=10)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig
