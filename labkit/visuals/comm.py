"""Figures of lesson 06 (and 04): interconnects, predicted vs measured, compression, overlap.

Every figure puts a prediction from ``labkit.theory`` next to a measurement from the
student's own run and says which is which (predicted: hatched bars or lines; measured:
solid bars or dots). Times in seconds (log axes where they span decades); bytes in decimal
units (1 MB = 1e6 B); all-reduce times follow the ring alpha-beta model
``2(n-1)*alpha + 2(n-1)/n * bytes / bandwidth``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from labkit.base.events import Lane
from labkit.theory.comm import ring_allreduce_time
from labkit.theory.interconnect import INTERCONNECTS, Interconnect, predict_step_time
from labkit.visuals.axes import headroom, integer_ticks, log_ticks

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from labkit.analysis.timeline import Timeline

PRED_STYLE = {"hatch": "//", "alpha": 0.45, "edgecolor": "black"}


def _fig(ncols: int = 1, width: float = 7.0, height: float = 4.0) -> tuple[Any, Any]:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width, height), squeeze=False)
    plt.close(fig)
    return fig, axes[0]


def plot_interconnects(links: Sequence[Interconnect] | None = None, *, world_size: int = 8,
                       sizes: Sequence[float] | None = None,
                       measured: tuple[Sequence[float], Sequence[float]] | None = None,
                       measured_world_size: int = 2) -> Figure:
    """Predicted ring all-reduce time vs message size per link (lines), measured dots."""
    chosen = list(links) if links is not None else list(INTERCONNECTS.values())
    xs = list(sizes) if sizes is not None else [10 ** (3 + k / 4) for k in range(25)]
    fig, (ax,) = _fig()
    for link in chosen:
        n = measured_world_size if link.name == "this machine" else world_size
        ax.plot(xs, [ring_allreduce_time(x, n, link.alpha_s, link.bandwidth_Bps) for x in xs],
                ls="--" if link.scope == "inter-node" else "-",
                label=f"{link.name} (predicted, n={n})")
    if measured is not None:
        ax.scatter(list(measured[0]), list(measured[1]), color="black", zorder=5,
                   label=f"measured here (n={measured_world_size})")
    ax.set(xlabel="all-reduce payload (decimal bytes, log scale)",
           ylabel="time per all-reduce (log scale)", title="All-reduce time by interconnect "
           "(solid: intra-node, dashed: inter-node)")
    log_ticks(ax, "x", "bytes")
    log_ticks(ax, "y", "seconds")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_fit_validation(report: dict[str, Any]) -> Figure:
    """Measured vs predicted all-reduce times; held-out sizes marked, +-20% band drawn."""
    rows = report["rows"]
    fig, (ax,) = _fig()
    xs = [r["bytes"] for r in rows]
    ax.plot(xs, [r["predicted_s"] for r in rows], "-", color="C0",
            label="predicted (alpha-beta fit)")
    ax.fill_between(xs, [0.8 * r["predicted_s"] for r in rows],
                    [1.2 * r["predicted_s"] for r in rows], color="C0", alpha=0.15,
                    label="prediction +-20%")
    for used, marker, label in ((True, "o", "measured, used for the fit"),
                                (False, "s", "measured, held out")):
        pts = [r for r in rows if r["used_for_fit"] == used]
        ax.scatter([r["bytes"] for r in pts], [r["measured_s"] for r in pts], marker=marker,
                   color="black" if used else "C3", zorder=5, label=label)
    fit = report["fit"]
    log_ticks(ax, "x", "bytes")
    log_ticks(ax, "y", "seconds")
    ax.set(xlabel="payload (decimal bytes, log scale)", ylabel="time per all-reduce (log scale)",
           title=f"this machine: alpha={fit.alpha_s * 1e6:.1f} us, bandwidth="
                 f"{fit.bandwidth_Bps / 1e9:.2f} GB/s; worst held-out error "
                 f"{report['max_holdout_error']:.0%}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_strategy_links(links: Sequence[Interconnect], *, compute_s: float, params: float,
                        hidden: int, layers: int, batch: int, seq: int, microbatches: int,
                        world_size: int = 8, bytes_per_value: int = 2,
                        dp_overlap: float = 0.0) -> Figure:
    """Predicted step time of DP, TP and PP on each link: compute, comm and bubble stacked."""
    import numpy as np

    fig, (ax,) = _fig(width=8.0)
    strategies = ("dp", "tp", "pp")
    width = 0.8 / len(links)
    for j, link in enumerate(links):
        for i, s in enumerate(strategies):
            # per rank compute: dp keeps the whole model on a 1/n batch, tp and pp 1/n model
            p = predict_step_time(s, params=params, compute_s=compute_s / world_size,
                                  world_size=world_size, link=link,
                                  bytes_per_value=bytes_per_value, overlap=dp_overlap,
                                  batch=batch, seq=seq, hidden=hidden, layers=layers,
                                  microbatches=microbatches)
            x = i + (j - (len(links) - 1) / 2) * width
            bottom = 0.0
            for part, color in ((p.compute_s, "#4C9BE8"), (p.comm_s, "#E15759"),
                                (p.bubble_s, "#D7D7D7")):
                ax.bar(x, part, width * 0.9, bottom=bottom, color=color, **PRED_STYLE)
                bottom += part
            ax.text(x, bottom, f"{link.name}\n{p.efficiency:.0%}", ha="center",
                    va="bottom", fontsize=7)
    ax.set_xticks(np.arange(len(strategies)), [s.upper() for s in strategies])
    ax.set_ylabel("predicted step time per rank (s)")
    headroom(ax, 0.2)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(facecolor=c, label=t, hatch="//", edgecolor="#555") for c, t in (
        ("#4C9BE8", "compute"), ("#E15759", "exposed communication"), ("#D7D7D7", "bubble"))],
        fontsize=8, loc="upper center", frameon=False)
    ax.set_title(f"Predicted (not measured): {world_size} ranks; over each bar the link and "
                 "the compute share of the step", fontsize=9)
    fig.tight_layout()
    return fig


def plot_compression_tradeoff(comparison: dict[str, Any]) -> Figure:
    """Left: wire bytes per step, measured (solid) and predicted (hatched). Right: losses."""
    rows, losses = comparison["rows"], comparison["losses"]
    fig, (ax_b, ax_l) = _fig(2, width=11.0)
    names = [r["method"] for r in rows]
    xs = range(len(rows))
    ax_b.bar([x - 0.2 for x in xs], [r["wire_bytes"] for r in rows], 0.4,
             label="measured (trace)", color="#E15759")
    ax_b.bar([x + 0.2 for x in xs], [r["predicted_wire_bytes"] for r in rows], 0.4,
             label="predicted (shapes)", color="#E15759", **PRED_STYLE)
    for x, r in zip(xs, rows):
        ax_b.text(x, r["wire_bytes"], f"{r['ratio']:.1f}x\n{r['step_time_s'] * 1e3:.0f} ms",
                  ha="center", va="bottom", fontsize=7)
    ax_b.set_xticks(list(xs), names)
    ax_b.set(ylabel="bytes one rank sends per step (log scale)",
             title="Bytes on the wire (label: reduction, measured step time)")
    lo, hi = ax_b.get_ylim()
    ax_b.set_yscale("log")
    ax_b.set_ylim(min(r["wire_bytes"] for r in rows) / 2, hi * 4)  # room for the labels
    log_ticks(ax_b, "y", "bytes")
    ax_b.legend(fontsize=7, loc="upper right")
    for name, curve in losses.items():
        ax_l.plot(range(len(curve)), curve, marker=".", label=name)
    ax_l.set(xlabel="step", ylabel="training loss (measured)",
             title="Loss on the same seeded task")
    integer_ticks(ax_l, "x")
    ax_l.legend(fontsize=7)
    fig.tight_layout()
    return fig


def rank_shares(timeline: Timeline) -> list[dict[str, float]]:
    """Per rank over the steady-state steps: compute, comm-only and idle shares of its span."""
    from labkit.analysis.timeline import intersect, total, union

    w = timeline.window()
    out = []
    for r in w.ranks:
        comp = union((e.start_ns, e.end_ns) for e in w.events
                     if e.rank == r and e.lane == Lane.COMPUTE)
        comm = union((e.start_ns, e.end_ns) for e in w.events
                     if e.rank == r and e.lane == Lane.COMM)
        span = w.span_ns(r) or 1
        c, m = total(comp), total(comm) - total(intersect(comm, comp))
        out.append({"compute": c / span, "comm": m / span, "idle": max(0.0, 1 - (c + m) / span)})
    return out


def plot_tp_utilisation(timelines: dict[str, Timeline]) -> Figure:
    """Measured share of each rank's time spent computing, communicating (not hidden), idle."""
    fig, (ax,) = _fig(width=8.0)
    labels, x = [], 0
    for name, tl in timelines.items():
        for r, share in enumerate(rank_shares(tl)):
            bottom = 0.0
            for part, color in (("compute", "#4C9BE8"), ("comm", "#E15759"),
                                ("idle", "#D7D7D7")):
                ax.bar(x, share[part], 0.8, bottom=bottom, color=color,
                       label=part if x == 0 else None)
                bottom += share[part]
            labels.append(f"{name}\nrank {r}")
            x += 1
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set(ylabel="share of the step (measured)", ylim=(0, 1),
           title="Utilisation per rank: compute vs exposed communication vs idle")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_tp_bytes(metrics: dict[str, Any]) -> Figure:
    """All-reduce bytes per layer: measured from the trace (solid) vs predicted (hatched)."""
    measured = metrics["comm_bytes_per_layer_measured"]
    pred = metrics["comm_bytes_per_layer_predicted"]
    fig, (ax,) = _fig()
    for i, m in enumerate(measured):
        for j, phase in enumerate(("forward", "backward")):
            x = i * 3 + j
            ax.bar(x - 0.2, m[phase], 0.4, color="C0" if j == 0 else "C1",
                   label=f"{phase} measured" if i == 0 else None)
            ax.bar(x + 0.2, pred[phase], 0.4, color="C0" if j == 0 else "C1",
                   label=f"{phase} predicted" if i == 0 else None, **PRED_STYLE)
    ax.set_xticks([i * 3 + 0.5 for i in range(len(measured))],
                  [f"layer {i}" for i in range(len(measured))])
    ax.set(ylabel="all-reduce payload bytes per step",
           title="TP: bytes per layer (predicted: count x b*s*h x 4 B)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_overlap(rows: Sequence[dict[str, Any]]) -> Figure:
    """Measured communication per run split into hidden (under compute) and exposed."""
    fig, (ax,) = _fig(width=8.0)
    names = [r["name"] for r in rows]
    hidden = [r["hidden_s"] * 1e3 for r in rows]
    exposed = [r["exposed_s"] * 1e3 for r in rows]
    ax.barh(names, hidden, color="#59A14F", label="hidden under compute")
    ax.barh(names, exposed, left=hidden, color="#E15759", label="exposed (on the critical path)")
    for y, r in enumerate(rows):
        ax.text(hidden[y] + exposed[y], y, f" {r['overlap_fraction']:.0%} hidden", va="center",
                fontsize=7)
    ax.set(xlabel="communication per rank and step (ms, measured)",
           title="What hides and what does not")
    # room for the "N% hidden" labels right of the longest bar; the legend goes under the
    # axes, where no bar or label can sit behind it
    ax.set_xlim(0, 1.18 * max((h + e for h, e in zip(hidden, exposed)), default=1.0))
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    fig.tight_layout()
    return fig
