"""Figures of lesson 02: loss curves per experiment and the LR schedule.

Conventions: the x axis of loss curves is *samples seen* (steps x global batch), so a run
on N ranks and a run on 1 rank are compared on the same amount of data (Goyal et al. 2017
compare at equal epochs). LRs follow ``labkit.theory.lr_at_step`` (linear warmup from 0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from matplotlib.figure import Figure

from labkit.analysis.plots import new_figure
from labkit.theory import lr_schedule


def plot_loss_curves(runs: Mapping[str, object], *, title: str = "Loss vs samples seen",
                     ylim_factor: float = 1.6) -> Figure:
    """One line per run (``CurveRun``-like: ``samples``, ``losses``); divergence marked.

    A run whose loss leaves the plot (or turns NaN) is cut at the top and marked with an
    ``x`` labelled "diverged" at the last sample it was on the plot.
    """
    fig = new_figure(figsize=(8, 4.5))
    ax = fig.add_subplot()
    first = [r.losses[0] for r in runs.values() if r.losses]  # type: ignore[attr-defined]
    top = ylim_factor * max(first) if first else 1.0
    for name, r in runs.items():
        xs, ys = r.samples, r.losses  # type: ignore[attr-defined]
        shown = [y if math.isfinite(y) and y <= top else math.nan for y in ys]
        (line,) = ax.plot(xs, shown, label=name, lw=1.5)
        bad = [i for i, y in enumerate(ys) if not (math.isfinite(y) and y <= top)]
        if bad:
            ax.plot([xs[bad[0]]], [top * 0.97], "x", color=line.get_color(), ms=10, mew=2)
            ax.annotate("diverged", (xs[bad[0]], top * 0.97), textcoords="offset points",
                        xytext=(5, -12), color=line.get_color(), fontsize=8)
    ax.set_ylim(0, top)
    ax.set_xlabel("samples seen (steps x global batch)")
    ax.set_ylabel("training loss (cross-entropy)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def plot_lr_schedule(*, target_lr: float = 0.004, warmup_steps: int = 500, steps: int = 1000,
                     mark_step: int | None = 250,
                     measured: Sequence[float] | None = None,
                     measured_label: str = "measured (LR each rank used)") -> Figure:
    """The warmup schedule from ``labkit.theory`` with one step marked (the seed's example).

    Defaults are the worked example: target 0.004 (0.001 x 1024/256), 500 warmup steps,
    step 250 marked at 0.002. ``measured`` overlays the LRs a real run recorded per step.
    """
    fig = new_figure(figsize=(7, 3.8))
    ax = fig.add_subplot()
    lrs = lr_schedule(steps, target_lr=target_lr, warmup_steps=warmup_steps)
    ax.plot(range(steps), lrs, label="predicted: labkit.theory.lr_schedule", color="C0")
    if measured is not None:
        ax.plot(range(len(measured)), list(measured), "o", ms=4, color="C1", label=measured_label)
    if mark_step is not None and 0 <= mark_step < steps:
        y = lrs[mark_step]
        ax.plot([mark_step], [y], "o", color="C3", ms=8, zorder=5)
        ax.annotate(f"step {mark_step}: LR {y:.4g}", (mark_step, y), textcoords="offset points",
                    xytext=(10, -15), color="C3")
    ax.axvline(warmup_steps, ls=":", color="grey")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("learning rate")
    ax.set_title(f"Linear warmup to {target_lr:g} over {warmup_steps} steps")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig
