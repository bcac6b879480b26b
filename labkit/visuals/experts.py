"""How an MoE run's router spread its tokens: assignments per expert, against the even share
and the capacity, for one or more runs (lesson 14; Fedus et al. 2021's load balance).

Returns a matplotlib ``Figure``; never calls ``plt.show()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from labkit.analysis.plots import new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def plot_expert_load(runs: dict[str, Any]) -> Figure:
    """Bars: step 0's assignments routed to each expert (all ranks and layers) per run; the
    dashed line is the even share. The title of each panel gives the dropped assignments and
    the load imbalance (busiest expert over the mean)."""
    fig = new_figure((4 * len(runs), 3.2))
    for i, (name, r) in enumerate(runs.items()):
        m = r.metrics
        load = m["tokens_per_expert"]
        ax = fig.add_subplot(1, len(runs), i + 1)
        ax.bar(range(len(load)), load, color="#17BECF")
        ax.axhline(sum(load) / len(load), color="black", linestyle="--", linewidth=1,
                   label="even share")
        ax.set_xticks(range(len(load)))
        ax.set_xlabel("expert")
        ax.set_title(f"{name}: imbalance {m['load_imbalance']:.2f}, dropped "
                     f"{m['dropped_assignments']}", fontsize=9)
        if i == 0:
            ax.set_ylabel("assignments routed (step 0)")
            ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
