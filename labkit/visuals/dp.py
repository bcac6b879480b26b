"""Figures of the data-parallelism lesson, all drawn from recorded runs.

* ``plot_bench``: measured all-reduce time per size beside the alpha-beta prediction, and
  bus bandwidth (nccl-tests: busbw = algbw x 2(n-1)/n);
* ``plot_allreduce_bytes``: bytes each rank sent, from the trace, for the ring and the naive
  schemes, with the formula's value marked;
* ``plot_dp_variants``: per-rank timelines of the DDP variants on one time scale;
* ``plot_train_step``: one real step: per-rank loss, local gradient norms (different per
  rank), averaged gradient norms (identical), the update;
* ``plot_scaling``: step time and efficiency for 1, 2, 4 ranks vs the alpha-beta prediction;
* ``plot_roofline``: compute vs all-reduce time per step as the batch per rank grows;
* ``plot_bucket_sweep``, ``plot_stale_sgd``, ``plot_duplicates``: the experiments.
Units: bytes, seconds; GB = 1e9 bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from labkit.theory import AlphaBeta, naive_allreduce_bytes, ring_allreduce_bytes
from labkit.visuals.axes import log_ticks
from labkit.visuals.ring_anim import plot_ring_state, ring_record  # noqa: F401 (re-export)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from labkit.analysis.timeline import Timeline


def _fig(nrows: int = 1, ncols: int = 1, size: tuple[float, float] = (10, 4)) -> tuple[Any, Any]:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=size, squeeze=False)
    plt.close(fig)
    return fig, axes


def plot_bench(runs: Mapping[str, Mapping[str, Any]]) -> Figure:
    """``runs``: label -> ``RunResult.metrics`` of ``allreduce-bench`` (needs ``results``)."""
    fig, axes = _fig(1, 2, (11, 4))
    t_ax, b_ax = axes[0]
    for label, m in runs.items():
        rows = m["results"]
        sizes = [r["bytes"] for r in rows]
        line, = t_ax.plot(sizes, [r["time_s"] * 1e3 for r in rows], "o-",
                          label=f"{label}: measured")
        ab = m.get("alpha_beta")
        if ab:
            t_ax.plot(sizes, [t * 1e3 for t in ab["predicted_time_s"]], "--",
                      color=line.get_color(),
                      label=f"{label}: predicted (α={ab['alpha_s'] * 1e6:.0f} µs, "
                            f"B={ab['bandwidth_gbps']:.2f} GB/s"
                            + (f"; fitted to the {ab['statistic']}s" if ab.get("statistic")
                               else "") + ")")
        b_ax.plot(sizes, [r["busbw_gbps"] for r in rows], "o-", color=line.get_color(),
                  label=label)
    for ax in (t_ax, b_ax):
        ax.set_xlabel("message size (decimal bytes)")
        log_ticks(ax, "x", "bytes")
    log_ticks(t_ax, "y", "ms")
    t_ax.set_ylabel("time per all-reduce (ms, log scale)")
    t_ax.set_title("measured (solid) vs alpha-beta prediction (dashed)")
    b_ax.set_ylabel("bus bandwidth (GB/s)")
    b_ax.set_title("busbw = size/time x 2(n-1)/n")
    t_ax.legend(fontsize=7)
    b_ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def bytes_per_scheme(timeline: Timeline) -> dict[str, list[int]]:
    """Bytes each rank sent per scheme in a ``compare_schemes`` run (steps 0, 1, 2)."""
    from labkit.strategies.collectives.ring import SCHEME_STEPS

    return {name: [sum(e.bytes or 0 for e in timeline.select(rank=r, step=step)
                       if e.op.value == "send") for r in timeline.ranks]
            for name, step in SCHEME_STEPS.items()}


def plot_allreduce_bytes(measured: Mapping[str, Sequence[int]], size_bytes: int) -> Figure:
    """Bars: bytes sent by each rank per scheme (from traces); dots: the formula's value."""
    fig, axes = _fig(size=(9, 3.8))
    ax = axes[0, 0]
    schemes = list(measured)
    n = len(next(iter(measured.values())))
    width = 0.8 / max(len(schemes), 1)
    for i, scheme in enumerate(schemes):
        xs = [r + i * width for r in range(n)]
        ax.bar(xs, [b / 1e6 for b in measured[scheme]], width, label=f"{scheme} (measured)")
        if scheme == "ring":
            pred = [ring_allreduce_bytes(size_bytes, n)] * n
        else:
            d = naive_allreduce_bytes(size_bytes, n, scheme)
            pred = [d["root"]] + [d["non_root"]] * (n - 1)
        ax.plot(xs, [p / 1e6 for p in pred], "k_", markersize=14, mew=2)
    ax.plot([], [], "k_", markersize=14, mew=2, label="predicted (formula)")
    ax.set_xticks([r + width * (len(schemes) - 1) / 2 for r in range(n)])
    ax.set_xticklabels([f"rank {r}" for r in range(n)])
    ax.set_ylabel("MB sent by this rank")
    ax.set_title(f"all-reduce of {size_bytes / 1e6:g} MB on {n} ranks: who sends what")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_dp_variants(runs: Mapping[str, Any], step: int | None = None) -> Figure:
    """The variants' per-rank timelines on one time scale, one step each (default: the last).

    ``runs``: name -> ``RunResult`` (or a ``Timeline``). Each panel's title gives the share of
    communication hidden under compute over the run (the ``overlap_fraction`` a notebook
    prints) and in the step drawn, so the two numbers never disagree unexplained."""
    from labkit.analysis.plots import plot_timelines

    chosen = {}
    for name, run in runs.items():
        tl = getattr(run, "timeline", run)
        metrics = getattr(run, "metrics", None) or {}
        whole = metrics.get("overlap_fraction", tl.window().overlap_fraction())
        s = tl.steps()[-1] if step is None else step
        w = tl.window([s])
        chosen[f"{name}: comm hidden under compute {whole:.0%} over the run "
               f"(step {s}, drawn: {w.overlap_fraction():.0%})"] = w
    return plot_timelines(chosen)


def plot_train_step(records: Sequence[Mapping[str, Any]]) -> Figure:
    """One recorded step: loss, local and averaged gradient norms, update size, per rank."""
    fig, axes = _fig(1, 3, (12, 3.8))
    recs = sorted(records, key=lambda r: r["rank"])
    names = recs[0]["param_names"]
    layers = range(len(names))
    loss_ax, grad_ax, upd_ax = axes[0]
    loss_ax.bar([f"rank {r['rank']}" for r in recs], [r["loss"] for r in recs],
                color="#4C9BE8")
    step = recs[0].get("step")
    loss_ax.set_title("1. loss on each rank's own shard"
                      + (f" (step {step})" if step is not None else ""), fontsize=10)
    loss_ax.set_ylabel("training loss (cross-entropy)")
    for r in recs:
        grad_ax.plot(layers, r["grad_norms_local"], "o-", label=f"rank {r['rank']} local")
    grad_ax.plot(layers, recs[0]["grad_norms_synced"], "k*--", markersize=10,
                 label="after all-reduce (all ranks)")
    grad_ax.set_title("2-3. |grad| per tensor: local vs averaged", fontsize=10)
    grad_ax.set_ylabel("gradient norm (L2)")
    grad_ax.set_xticks(list(layers))
    grad_ax.set_xticklabels(names, rotation=70, fontsize=6)
    grad_ax.legend(fontsize=7)
    for r in recs:
        upd_ax.plot(layers, r["update_norms"], "o-", label=f"rank {r['rank']}")
    upd_ax.set_title("4. update |Δw| per tensor (identical)", fontsize=10)
    upd_ax.set_ylabel("update norm (L2)")
    upd_ax.set_xticks(list(layers))
    upd_ax.set_xticklabels(names, rotation=70, fontsize=6)
    upd_ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def predict_scaling(step_time_1: float, grad_bytes: int, fit: AlphaBeta,
                    world_sizes: Sequence[int], overlap: float = 0.0,
                    messages: int = 1) -> dict[int, float]:
    """Weak-scaling step time on n ranks: one rank's step + the exposed ring all-reduce of
    ``grad_bytes``, sent as ``messages`` all-reduces (each pays the latency: ddp-naive sends
    one per parameter tensor), each the fit's mean call (``AlphaBeta.predict_mean``: its
    line, plus the stall a call showed on average where the fit measured one)."""
    def comm(n: int) -> float:
        return (messages * fit.predict_mean(grad_bytes / messages, n)) if n > 1 else 0.0

    return {n: step_time_1 + (1 - overlap) * comm(n) for n in world_sizes}


def plot_scaling(measured: Mapping[int, float], predicted: Mapping[int, float]) -> Figure:
    """Step time and weak-scaling efficiency (t1 / tn) per world size: measured vs predicted."""
    fig, axes = _fig(1, 2, (11, 3.8))
    t_ax, e_ax = axes[0]
    ns = sorted(measured)
    t1m, t1p = measured[ns[0]], predicted[ns[0]]
    t_ax.plot(ns, [measured[n] * 1e3 for n in ns], "o-", label="measured")
    t_ax.plot(ns, [predicted[n] * 1e3 for n in ns], "s--",
              label="predicted (alpha-beta, plus each call's mean stall)")
    e_ax.plot(ns, [t1m / measured[n] for n in ns], "o-", label="measured")
    e_ax.plot(ns, [t1p / predicted[n] for n in ns], "s--", label="predicted")
    e_ax.axhline(1.0, color="#999", lw=0.8)
    t_ax.set_ylabel("step time (ms)")
    e_ax.set_ylabel("efficiency t1 / tn (1 = perfect)")
    for ax in (t_ax, e_ax):
        ax.set_xlabel("ranks (same batch per rank)")
        ax.set_xticks(ns)
        ax.legend(fontsize=8)
    t_ax.set_title("weak scaling: the step grows by the exposed all-reduce")
    fig.tight_layout()
    return fig


def plot_bucket_sweep(caps_mb: Sequence[float], step_s: Sequence[float],
                      overlap: Sequence[float]) -> Figure:
    """Step time and overlap fraction of ``ddp-bucketed`` per bucket size."""
    fig, axes = _fig(1, 1, (7, 3.5))
    ax = axes[0, 0]
    ax.plot(caps_mb, [s * 1e3 for s in step_s], "o-", color="#E15759", label="step time")
    ax.set_xlabel("bucket_cap_mb (MB per bucket, log scale)")
    log_ticks(ax, "x", "plain")
    ax.set_ylabel("step time (ms)", color="#E15759")
    ax2 = ax.twinx()
    ax2.plot(caps_mb, overlap, "s--", color="#4C9BE8", label="overlap fraction")
    ax2.set_ylabel("share of comm hidden", color="#4C9BE8")
    ax2.set_ylim(0, 1)
    ax.set_title("bucket size: small = many messages, large = late start")
    fig.tight_layout()
    return fig


def plot_roofline(batches: Sequence[int], compute_s: Sequence[float], allreduce_s: Sequence[float],
                  crossover: float | None = None,
                  model: tuple[float, float] | None = None) -> Figure:
    """Compute and all-reduce time per step against the batch per rank (log-log): compute
    grows with the batch, the all-reduce does not; the crossover marked where measured, and
    ``model`` = (floor s, s per sample), the fitted compute line, dotted
    (``labkit.lessons.dp_roofline.Roofline.floor_model``)."""
    fig, axes = _fig(1, 1, (7, 3.5))
    ax = axes[0, 0]
    ax.plot(batches, compute_s, "o-", color="#F28E2B", label="compute (forward + backward)")
    ax.plot(batches, allreduce_s, "s-", color="#E15759", label="all-reduce of the gradients")
    if model is not None and all(math.isfinite(v) for v in model):
        floor, per_sample = model
        xs = [batches[0] * (batches[-1] / batches[0]) ** (i / 40) for i in range(41)]
        ax.plot(xs, [floor + x * per_sample for x in xs], ":", color="#F28E2B",
                label=f"floor {floor * 1e3:.2f} ms + {per_sample * 1e3:.3f} ms a sample")
    if crossover is not None and math.isfinite(crossover):
        ax.axvline(crossover, color="grey", ls="--", lw=1,
                   label=f"crossover ~ {crossover:.0f} samples")
    log_ticks(ax, "x", "plain")
    log_ticks(ax, "y", "seconds")
    ax.set_xlabel("batch per rank (samples, log scale)")
    ax.set_ylabel("time per step (log scale)")
    ax.set_title("the roofline of data parallelism, measured (least of the repeats)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_stale_sgd(losses: Mapping[int, Sequence[float]]) -> Figure:
    """SIMULATION (one process): loss curves of SGD with gradients k steps stale."""
    fig, axes = _fig(1, 1, (7, 3.5))
    ax = axes[0, 0]
    for k, curve in sorted(losses.items()):
        ax.plot(curve, label="synchronous (k=0)" if k == 0 else f"stale by k={k} steps")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title("SIMULATION of asynchronous SGD: stale gradients")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


DUP_COLORS = ("#FFFFFF", "#4C9BE8", "#E15759")
"""Not loaded by this rank; loaded by this rank only; loaded by this rank and another."""


def plot_duplicates(cases: Mapping[str, Sequence[Mapping[str, Any]]] | Sequence[Mapping[str, Any]],
                    epoch: int = 0) -> Figure:
    """Which sample ids each rank loaded in one epoch, one panel per case (e.g. without the
    sampler and the correct setup beside it): blue = only this rank loaded it, red = another
    rank loaded it too (wasted work)."""
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    named = dict(cases) if isinstance(cases, Mapping) else {"": cases}
    fig, axes = _fig(len(named), 1, (9, 0.4 + sum(0.9 + 0.45 * len(r) for r in named.values())))
    for ax, (label, results) in zip(axes[:, 0], named.items()):
        recs = sorted(results, key=lambda r: r["rank"])
        ids = sorted({i for r in recs for e in r["epochs"] for i in e})
        loaded = np.zeros((len(recs), len(ids)))
        for row, r in enumerate(recs):
            for i in r["epochs"][epoch]:
                loaded[row, ids.index(i)] = 1
        shared = loaded.sum(axis=0) > 1
        grid = np.where(loaded > 0, np.where(shared[None, :], 2, 1), 0)
        ax.imshow(grid, cmap=ListedColormap(DUP_COLORS), aspect="auto", vmin=0, vmax=2)
        ax.set_yticks(range(len(recs)), [f"rank {r['rank']}" for r in recs])
        ax.set_xticks(range(len(ids)), [str(i) for i in ids], fontsize=7)
        ax.set_xticks([x - 0.5 for x in range(1, len(ids))], minor=True)
        ax.grid(which="minor", axis="x", color="#DDD", lw=0.5)
        ax.tick_params(which="minor", length=0)
        ax.set_title(f"{label + ': ' if label else ''}epoch {epoch}, {int(shared.sum())} of "
                     f"{len(ids)} samples loaded by more than one rank", fontsize=10)
    axes[-1, 0].set_xlabel("sample id")
    axes[0, 0].legend(handles=[Patch(facecolor=c, edgecolor="#999", label=t) for c, t in zip(
        DUP_COLORS[1:], ("loaded by this rank only", "loaded by another rank too"))],
        loc="lower left", bbox_to_anchor=(0.0, 1.25), ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def plot_amdahl(result: Any, max_ranks: int = 8) -> Figure:
    """Amdahl's predicted speedup for the fitted parallel fraction (curve), the measured
    speedups (dots), perfect scaling (dashed) and seed 003's '8 GPUs give 6x' (star)."""
    from labkit.analysis.plots import new_figure
    from labkit.theory import amdahl_speedup

    fig = new_figure((7, 4))
    ax = fig.add_subplot(1, 1, 1)
    ns = list(range(1, max_ranks + 1))
    f = result.parallel_fraction
    ax.plot(ns, ns, "--", color="#999", label="perfect scaling")
    ax.plot(ns, [amdahl_speedup(f, n) for n in ns], color="#4C9BE8",
            label=f"Amdahl, fitted f = {f:.3f} (predicted)")
    ax.plot(list(result.speedups), list(result.speedups.values()), "o", color="#E15759",
            markersize=8, label="measured on this machine")
    ax.plot([8], [6], "*", color="#59A14F", markersize=12, label="seed 003: 8 GPUs, 6x")
    ax.plot([4], [2], "s", color="#F28E2B", markersize=7, label="mini challenge: 2x on 4")
    ax.set_xlabel("ranks (same global batch)")
    ax.set_ylabel("speedup over 1 rank")
    ax.set_title("Amdahl's law: the part of a step that does not scale caps the speedup")
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    return fig
