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


def plot_noise_scale(windows: Sequence[tuple[int, float, float]], b_noise: float,
                     batches: Sequence[int]) -> Figure:
    """Left: the measured simple noise scale over a run (one point per window of steps) with
    the loss beside it. Right: McCandlish et al.'s trade-off ``S/S_min`` against ``E/E_min``
    for that ``b_noise``, the lesson's ``batches`` marked on the curve."""
    from labkit.theory import examples_needed, steps_needed

    fig = new_figure(figsize=(10, 3.8))
    left, right = fig.subplots(1, 2)
    steps = [w[0] for w in windows]
    left.plot(steps, [w[2] for w in windows], "o-", color="C0", label="B_simple (measured)")
    left.axhline(b_noise, ls=":", color="C0")
    left.set_xlabel("optimizer step")
    left.set_ylabel("simple noise scale (samples)")
    left.set_title("Gradient noise scale during a real 2-rank run")
    twin = left.twinx()
    twin.plot(steps, [w[1] for w in windows], "s--", color="C1", ms=4, label="loss")
    twin.set_ylabel("training loss", color="C1")
    left.legend(loc="upper left", fontsize=8)
    span = [b_noise * 2 ** (k / 4) for k in range(-28, 29)]
    right.plot([examples_needed(b, b_noise) for b in span], [steps_needed(b, b_noise) for b in span],
               color="grey", label=f"predicted, B_noise = {b_noise:.0f}")
    for b in batches:
        e, s = examples_needed(b, b_noise), steps_needed(b, b_noise)
        right.plot([e], [s], "o", ms=7)
        right.annotate(f"batch {b}", (e, s), textcoords="offset points", xytext=(6, 4), fontsize=8)
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel("samples / E_min")
    right.set_ylabel("steps / S_min")
    right.set_title("Steps vs samples (McCandlish et al. 2018)")
    right.legend(fontsize=8)
    right.grid(alpha=0.3, which="both")
    return fig
