"""Figures of lesson 10 (multi-node): the link, DDP across it, placement, hierarchy, compression.

Same conventions as ``labkit.visuals.comm``: measured = solid bars, predicted = hatched bars
(the alpha-beta model, ``labkit.lessons.cluster_predict``); rows that could not be measured (no
emulated cluster here) show the prediction alone, labelled "not measured". Times in ms,
rates in Mbit/s (decimal, as tc counts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from labkit.visuals.axes import headroom, log_ticks
from labkit.visuals.comm import PRED_STYLE, _fig

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from labkit.analysis.timeline import Timeline

MEASURED = "#4C9BE8"
PRED: dict[str, Any] = dict(PRED_STYLE)
PARTS = (("compute_s", "compute", "#4C9BE8"), ("exposed_s", "exposed comm", "#E15759"),
         ("other_s", "other", "#BAB0AC"))


def _ms(v: float | None) -> float:
    return 0.0 if v is None else v * 1e3


def _pairs(ax: Axes, labels: Sequence[str], measured: Sequence[float | None],
           predicted: Sequence[float | None], unit: str) -> None:
    """Measured (solid) and predicted (hatched) bars side by side per label."""
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], [m or 0.0 for m in measured], 0.4, color=MEASURED,
           label="measured")
    ax.bar([x + 0.2 for x in xs], [p or 0.0 for p in predicted], 0.4, color="white",
           label="predicted (alpha-beta)", **PRED)
    for x, m in zip(xs, measured):
        if m is None:
            ax.text(x - 0.2, 0, "not\nmeasured", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel(unit)
    headroom(ax)
    ax.legend(fontsize=8, loc="upper left")


def plot_link_check(rows: Sequence[dict[str, Any]]) -> Figure:
    """Each link: the rate it was shaped to (hatched) beside the TCP goodput measured."""
    fig, (ax,) = _fig(width=7.5)
    labels = [f"{r['link']}\n({r['rate_bps'] / 1e6:g} Mbit/s)" for r in rows]
    _pairs(ax, labels, [r["measured_bps"] / 1e6 if r["measured_bps"] else None for r in rows],
           [r["rate_bps"] / 1e6 for r in rows], "Mbit/s")
    ax.legend(["measured (TCP goodput)", "shaped rate (preset / 500)"], fontsize=8)
    ax.set_title("The emulated links: shaped rate vs measured")
    fig.tight_layout()
    return fig


def plot_ddp_links(ddp: dict[str, Any]) -> Figure:
    """DDP step per placement: measured parts stacked, the predicted step hatched beside it,
    scaling efficiency (t1 / t) above each."""
    fig, (ax,) = _fig(width=8.5, height=4.5)
    rows = ddp["rows"]
    xs = list(range(len(rows)))
    bottom = [0.0] * len(rows)
    for key, label, color in PARTS:
        vals = [_ms(r.get(key)) for r in rows]
        ax.bar([x - 0.2 for x in xs], vals, 0.4, bottom=bottom, color=color, label=label)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.bar([x + 0.2 for x in xs], [_ms(r.get("predicted_step_s")) for r in rows], 0.4,
           color="white", label="predicted step", **PRED)
    for x, r, top in zip(xs, rows, bottom):
        eff = r.get("efficiency")
        text = "not measured" if r.get("step_s") is None else f"efficiency {eff:.0%}"
        ax.text(x - 0.2, top, text, ha="center", va="bottom", fontsize=8)
    ax.set_xticks(xs)
    ax.set_xticklabels([r["name"].replace(", ", "\n") for r in rows], fontsize=8)
    ax.set(ylabel="ms per step",  # linear: stacked parts on a log axis would mislead
           title="DDP: the same step on one node and across links (weak scaling)")
    headroom(ax, 0.12)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def plot_overhead(overhead: dict[str, Any]) -> Figure:
    """The FAQ's ranges (shaded) against the exposed-communication share measured here."""
    fig, (ax,) = _fig(width=6.0, height=3.5)
    vals = [overhead["inside"] or 0.0, overhead["across"] or 0.0]
    ax.bar([0, 1], [v * 100 for v in vals], 0.5, color=[MEASURED, "#E15759"])
    for x, (lo, hi) in enumerate((overhead["faq_inside"], overhead["faq_across"])):
        ax.fill_between([x - 0.35, x + 0.35], lo * 100, hi * 100, color="grey", alpha=0.3,
                        label="seed 001's FAQ" if x == 0 else None)
    for x, v in enumerate(vals):
        ax.text(x, v * 100, f"{v:.0%}", ha="center", va="bottom", fontsize=9)
    headroom(ax)
    ax.set_xticks([0, 1])
    ax.set_xticklabels(["inside one node\n(loopback)", f"across nodes\n({overhead['link']})"])
    ax.set(ylabel="% of the step spent in exposed comm",
           title="Communication overhead, measured here")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def plot_placement(placement: dict[str, Any]) -> Figure:
    """TP and pipeline, inside one node and across the link: step times, predicted beside.
    A measured bar whose communication was mostly waiting for a core (``contention``) is
    cross-hatched and says so."""
    fig, (ax,) = _fig(width=8.0, height=4.2)
    rows = placement["rows"]
    labels = [r["strategy"] + "\n" + r["where"].replace("across ", "across\n") for r in rows]
    _pairs(ax, labels,
           [_ms(r["step_s"]) if r["step_s"] is not None else None for r in rows],
           [_ms(r["predicted_step_s"]) for r in rows], "ms per step")
    marked = False
    for x, r in enumerate(rows):
        if r.get("contention") and r["step_s"] is not None:
            ax.bar(x - 0.2, _ms(r["step_s"]), 0.4, fill=False, hatch="xx", edgecolor="#333",
                   linewidth=0, label=None if marked else "waited for a core (see text)")
            ax.text(x - 0.2, _ms(r["step_s"]), f"comm {r['contention']:.0f}x\nwhat the\nwire needs",
                    ha="center", va="bottom", fontsize=7)
            marked = True
    if marked:
        ax.legend(fontsize=8, loc="upper left")
    ax.set_title("Seed 003's rule: TP inside a node, pipeline across nodes")
    fig.tight_layout()
    return fig


def plot_hierarchical(hier: dict[str, Any]) -> Figure:
    """Flat ring vs hierarchical all-reduce on 2 nodes x 2 ranks, per size."""
    fig, (ax,) = _fig(width=7.0)
    rows = hier["rows"]
    _pairs(ax, [f"{r['impl']}\n{r['bytes'] / 1e6:g} MB" for r in rows],
           [_ms(r["time_s"]) if r["time_s"] is not None else None for r in rows],
           [_ms(r["predicted_s"]) for r in rows], "ms per all-reduce")
    ax.set_title("All-reduce across the slow link: flat ring vs hierarchical")
    fig.tight_layout()
    return fig


def plot_compression_links(comp: dict[str, Any]) -> Figure:
    """Speedup of each compression method over plain DDP, on loopback and on the slow link."""
    fig, (ax,) = _fig(width=7.0)
    rows = comp["rows"]
    xs = list(range(len(rows)))
    ax.bar([x - 0.2 for x in xs], [r["speedup_loopback"] for r in rows], 0.4,
           color="#BAB0AC", label="loopback (inside a node)")
    ax.bar([x + 0.2 for x in xs], [r["speedup_link"] or 0.0 for r in rows], 0.4,
           color="#E15759", label="across the slow link")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{r['method']}\n{r['wire_bytes'] / 1e3:.0f} KB" for r in rows])
    ax.set(ylabel="speedup over no compression (log scale)",
           title="Gradient compression pays where the link is the wall")
    log_ticks(ax, "y", "times")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_cluster_timeline(timeline: Timeline, steps: Sequence[int] | None = None) -> Figure:
    """The merged timeline of a multi-node run, each rank labelled with its node."""
    from labkit.analysis.plots import plot_timeline

    chosen = list(steps) if steps is not None else timeline.steps()[1:3]
    fig = plot_timeline(timeline, chosen)
    nodes = timeline.meta.get("node_of_rank") or []
    ax = fig.axes[0]
    if nodes:
        ax.set_yticklabels([f"rank {r} (node {nodes[r]})" for r in timeline.ranks])
    link = (timeline.meta.get("link") or {}).get("spec")
    ax.set_title(f"{ax.get_title()}, {len(set(nodes)) or 1} nodes"
                 + (f", link {link}" if link else ""))
    return fig
