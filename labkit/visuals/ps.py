"""Lesson 11 figures: loss against wall-clock time, staleness, and who waited for whom.

* ``plot_loss_vs_time``: per consistency model, the training loss (averaged over the last
  dozen gradients) against seconds, without and with a straggler, with the target loss;
* ``plot_staleness``: how many updates late each gradient arrived, per run;
* ``plot_push_pull``: a window of one run's timeline, a row per rank (the server, then the
  workers, the straggler marked): the workers' pulls and pushes and the server's updates.
"""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from labkit.analysis.plots import _legend, _units, draw_timeline, new_figure
from labkit.strategies.ps.records import smoothed

_STYLE = {"bsp": "#4C9BE8", "asp": "#E15759", "ssp": "#59A14F"}


CURVE_GRADS = 12
"""The loss curves average the last 12 gradients the server applied (BSP applies one
averaged gradient per round, so its window is 12 / workers rounds)."""


def loss_curve(metrics: dict[str, Any], grads: int = CURVE_GRADS) -> tuple[list[float], list[float]]:
    """Seconds and the smoothed loss of a parameter-server run: what the figure draws, and
    what the lesson's sentences read (its last point is the run's final loss)."""
    per = metrics["workers"] if metrics["consistency"] == "bsp" else 1
    t = [p[0] for p in metrics["loss_vs_time"]]
    return t, smoothed([p[1] for p in metrics["loss_vs_time"]], max(1, grads // per))


def plot_loss_vs_time(exp: Any, grads: int = CURVE_GRADS) -> Figure:
    """Smoothed loss vs seconds, one panel without and one with the straggler; the dashed
    line is the target loss, the dotted one when ASP's fast worker had pushed its last
    gradient (after it, the straggler trains alone)."""
    fig = new_figure((11, 3.8))
    groups = [[n for n in exp.runs if "straggler" not in n],
              [n for n in exp.runs if "straggler" in n]]
    axes = fig.subplots(1, 2, sharey=True)
    for ax, names, title in zip(axes, groups, ("equal workers", "with a straggler")):
        for name in names:
            m = exp.runs[name].metrics
            t, loss = loss_curve(m, grads)
            ax.plot(t, loss, color=_STYLE[m["consistency"]], label=m["consistency"].upper())
        ax.axhline(exp.target, color="#555", ls="--", lw=0.8,
                   label=f"target loss {exp.target:g}")
        if "straggler" in title and hasattr(exp, "fast_worker_done_s"):
            done_s = exp.fast_worker_done_s("asp, straggler")
            if done_s is not None:
                ax.axvline(done_s, color=_STYLE["asp"], ls=":", lw=1.2,
                           label="ASP: fast worker done")
        ax.set_title(title)
        ax.set_xlabel("seconds since the first pull (s)")
        ax.legend(frameon=False, fontsize=8, loc="lower left")
    axes[0].set_ylabel(f"training loss (mean of last {grads} gradients)")
    fig.tight_layout()
    return fig


def plot_staleness(exp: Any) -> Figure:
    """Histogram of staleness (updates late) per run: whole numbers on both axes."""
    from matplotlib.ticker import MaxNLocator

    fig = new_figure((11, 2.8))
    axes = fig.subplots(1, len(exp.runs), sharey=True)
    for ax, (name, res) in zip(axes, exp.runs.items()):
        hist = res.metrics["staleness_hist"]
        ax.bar(range(len(hist)), hist, color=_STYLE[res.metrics["consistency"]])
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("staleness (updates)", fontsize=8)
        width = max(len(hist), 3)
        ax.set_xlim(-0.6, width - 0.4)
        ax.set_xticks(range(0, width, -(-width // 5)))  # whole updates, at most 5 ticks
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_ylabel("gradients (count)")
    fig.tight_layout()
    return fig


def plot_push_pull(result: Any, start_s: float | None = None, span_s: float = 0.25,
                   title: str | None = None) -> Figure:
    """``span_s`` seconds of a ps run's timeline from ``start_s`` (default: the middle of
    the time every worker was still training)."""
    tl = result.timeline
    # everything but the server's idle wait for the next request
    spans = [e for e in tl.events if e.name != "request" and e.step is not None]
    lo = min(e.start_ns for e in spans)
    # default: the middle of the time every rank was still busy (a fast worker that has
    # finished its steps would leave an empty row)
    hi = min(max(e.end_ns for e in spans if e.rank == r) for r in {e.rank for e in spans})
    begin = (lo + hi) / 2 - span_s * 5e8 if start_s is None else lo + start_s * 1e9
    begin = max(lo, begin)
    end = begin + span_s * 1e9
    shown = [e for e in spans if e.end_ns > begin and e.start_ns < end]
    fig = new_figure((11, 0.9 + 0.7 * tl.world_size))
    ax = fig.subplots()
    scale, unit = _units(span_s * 1e9)
    draw_timeline(ax, shown, range(tl.world_size), scale=scale, origin=begin, links=False,
                  labels=False)
    opts = result.config.options
    straggler = int(opts.straggler.split(":")[0]) if opts.straggler else -1
    ax.set_yticklabels([("server" if r < opts.servers else f"worker {r - opts.servers}")
                        + (" (slow)" if r == straggler else "") + f"  r{r}"
                        for r in range(tl.world_size)])
    ax.set_xlim(0, span_s * 1e9 / scale)
    ax.set_xlabel(f"time ({unit}); top lane compute, bottom lane comm (pull / push)")
    ax.set_title(title or f"{opts.consistency}: pulls, pushes and updates")
    # the straggler's added time is an idle span inside its backward: hatch it, so it does
    # not read as compute
    idle = [e for e in shown if (e.name or "").startswith("slow")]
    for e in idle:
        ax.broken_barh([((e.start_ns - begin) / scale, e.dur_ns / scale)], (e.rank + 0.05, 0.42),
                       facecolors="white", edgecolor="#F28E2B", hatch="////", linewidth=0.5)
    _legend(ax, shown)
    if idle:
        from matplotlib.patches import Patch

        legend = ax.get_legend()
        idling = Patch(facecolor="white", edgecolor="#F28E2B", hatch="////",
                       label="straggler idling")
        handles = [*(legend.legend_handles if legend else []), idling]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8,
                  frameon=False)
    fig.tight_layout()
    return fig
