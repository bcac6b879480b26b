"""Figures for lesson 05: where a rank's memory goes under ZeRO stages 0-3.

* ``plot_memory_bars``: per rank, stacked bars of params / grads / optimizer state /
  saved activations; the measured bytes are the filled bars, the calculator's prediction
  (``labkit.theory.zero_memory``, ``mlp_activation_bytes``) the black outline on top.
* ``plot_memory_vs_dp``: predicted model-state bytes per rank as the data-parallel degree
  N_d grows, one curve per stage (Rajbhandari et al. 2020, Figure 1), with measured points.
* ``plot_zero_timeline``: one ZeRO-3 step on every rank: the all-gather before each
  layer's forward and backward, the reduce-scatter after each layer's backward.
All return a matplotlib ``Figure`` and never call ``plt.show()``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from labkit.theory import zero_memory
from labkit.visuals.axes import log_ticks

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from labkit.analysis.timeline import Timeline

TERMS = ("params", "grads", "optimizer", "activations")
TERM_COLORS = {"params": "#4C9BE8", "grads": "#F28E2B", "optimizer": "#59A14F",
               "activations": "#B07AA1"}


def _metrics(run: Any) -> Mapping[str, Any]:
    return run.metrics if hasattr(run, "metrics") else run


def _stack(metrics: Mapping[str, Any], rank: int) -> tuple[dict[str, float], dict[str, float]]:
    measured = {k: float(v) for k, v in metrics["per_rank_bytes"][rank].items() if k in TERMS}
    predicted = {k: float(v) for k, v in metrics["predicted_bytes"].items() if k in TERMS}
    saved = metrics.get("saved_activation_bytes")
    measured["activations"] = float(saved[rank]) if saved else 0.0
    predicted["activations"] = float(metrics.get("predicted_activation_bytes", 0.0))
    return measured, predicted


def plot_memory_bars(runs: Mapping[str, Any], *, unit: float = 1e3,
                     unit_name: str = "kB") -> Figure:
    """One group of bars per run (e.g. "stage 0".."stage 3"), one bar per rank.

    ``runs`` maps a label to a ``RunResult`` of ``labkit run zero`` or its ``metrics``.
    Filled: measured (storages kept between steps; activations from saved-tensor hooks).
    Black outline: predicted by the calculator for the same precision and optimizer.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(2.2 + 1.6 * len(runs), 4.2))
    x, ticks, labels = 0.0, [], []
    for label, run in runs.items():
        m = _metrics(run)
        ranks = len(m["per_rank_bytes"])
        for rank in range(ranks):
            measured, predicted = _stack(m, rank)
            bottom = pbottom = 0.0
            for term in TERMS:
                ax.bar(x, measured[term] / unit, 0.8, bottom=bottom / unit,
                       color=TERM_COLORS[term], label=f"measured {term}")
                bottom += measured[term]
                ax.bar(x, predicted[term] / unit, 0.8, bottom=pbottom / unit, fill=False,
                       edgecolor="black", linewidth=1.0, label=f"predicted {term}")
                pbottom += predicted[term]
            ticks.append(x)
            labels.append(f"{label}\nrank {rank}" if rank == 0 else f"rank {rank}")
            x += 1.0
        x += 0.7
    ax.set_xticks(ticks)
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel(f"bytes per rank ({unit_name})")
    ax.set_title("Per-rank memory: measured (filled) vs predicted (outline)")
    handles = [Patch(color=TERM_COLORS[t], label=t) for t in TERMS]
    handles.append(Patch(fill=False, edgecolor="black", label="predicted"))
    ax.legend(handles=handles, fontsize=8, frameon=False, loc="upper left",
              bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    plt.close(fig)
    return fig


def plot_memory_vs_dp(params: float, dps: Sequence[int] = (1, 2, 4, 8, 16, 32, 64), *,
                      precision: str = "mixed", optimizer: str = "adam",
                      measured: Iterable[tuple[int, int, float]] = (),
                      unit: float = 1e9, unit_name: str = "GB") -> Figure:
    """Predicted model-state bytes per rank vs N_d for stages 0-3 (log-log).

    ``measured``: optional points ``(stage, dp, bytes)`` drawn as markers on the curves.
    """
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    colors = ("#79706E", "#4C9BE8", "#F28E2B", "#59A14F")
    for stage in range(4):
        ys = [zero_memory(params, d, stage, precision, optimizer)["total"] / unit for d in dps]
        ax.plot(list(dps), ys, marker="", color=colors[stage], label=f"stage {stage} (formula)")
    points = list(measured)
    for stage, d, value in points:
        ax.plot([d], [value / unit], "o", color=colors[stage], markeredgecolor="black")
    if points:
        ax.plot([], [], "o", color="white", markeredgecolor="black", label="measured")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(dps), [str(d) for d in dps])  # the degrees drawn, written plainly
    ax.minorticks_off()
    log_ticks(ax, "y", "plain")
    ax.set_xlabel("data-parallel degree N_d (ranks, log scale)")
    ax.set_ylabel(f"model states per rank ({unit_name}, log scale)")
    ax.set_title(f"{params:.3g} params, {precision} {optimizer}: memory per rank vs N_d")
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    plt.close(fig)
    return fig


def plot_zero_timeline(timeline: Timeline, step: int = 1) -> Figure:
    """One step of a ZeRO run on every rank (labels: AGi = all-gather layer i, Fi / Bi =
    forward / backward of layer i, RSi = reduce-scatter of layer i's gradient)."""
    from labkit.analysis.plots import plot_timeline

    return plot_timeline(timeline, steps=[step], links=False,
                         title=f"ZeRO step {step}: all-gather before each layer, "
                               f"reduce-scatter after its backward")


def memory_table(runs: Mapping[str, Any], unit: float = 1e3, unit_name: str = "kB") -> str:
    """A text table: per run and rank, measured | predicted bytes of each model-state term,
    the padding, the comm per step relative to DDP, and the saved activations."""
    head = (f"{'run':<12}{'rank':>5}" + "".join(f"{t + ' meas|pred':>22}" for t in TERMS[:3])
            + f"{'padding':>9}{'comm/DDP':>9}{'activ. meas|pred':>20}")
    lines = [head, f"(bytes in {unit_name}; predicted = labkit.theory.zero_memory)"]
    for label, run in runs.items():
        m = _metrics(run)
        pads = m.get("padding_bytes") or [{}] * len(m["per_rank_bytes"])
        for rank, pad in enumerate(pads):
            measured, predicted = _stack(m, rank)
            cells = "".join(f"{measured[t] / unit:>11.2f}|{predicted[t] / unit:<10.2f}"
                            for t in TERMS[:3])
            act = f"{measured['activations'] / unit:>9.2f}|{predicted['activations'] / unit:<9.2f}"
            lines.append(f"{label:<12}{rank:>5}{cells}{sum(pad.values()) / unit:>9.3f}"
                         f"{m.get('comm_ratio_vs_ddp', 0.0):>9.3f}{act:>20}")
    return "\n".join(lines)
