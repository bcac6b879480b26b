"""What a parameter-server run measures, per rank and for the run (torch-free).

Each server records every gradient it applied (its staleness and its worker) and every
update (when, and the loss of the gradients in it); each worker records how long it waited
for its pulls. ``PSMetrics.combine`` turns them into the run's JSON metrics (the contract of
``labkit run ps --json``):

* ``staleness_hist`` -- index k holds how many gradients were applied k updates after the
  version they were computed on (every server counts its own shard's updates);
* ``max_staleness``, ``mean_staleness``, ``mean_staleness_per_worker`` (by worker index);
* ``clock_gap_hist`` -- index g holds how many reads were made g clocks ahead of the
  slowest worker (a worker's clock: the steps it has pushed; every server counts the reads
  of its shard), and ``max_clock_gap``: the quantity SSP bounds (Ho et al. 2013), where
  staleness is the one bounded delay bounds (``labkit.strategies.ps.protocol``);
* ``staleness_bound`` (ssp: s, in clocks) or ``delay_bound`` (bounded-delay: K, in updates),
  with ``bound_unit``;
* ``updates`` (server 0's version at the end) and ``updates_per_s`` (updates / seconds from
  the first request server 0 received to its last update);
* ``loss_per_update`` -- the training loss of the gradients in each update of server 0 (BSP:
  the mean over the round's workers, so it equals synchronous DDP's per-step loss);
* ``loss_vs_time`` -- pairs [seconds since server 0's first request, loss] for the same
  updates: the curve to read "time to reach a loss" from (``time_to_loss``);
* ``pull_wait_s_per_worker`` -- seconds each worker spent waiting for pulls (the price of
  BSP and SSP waiting for a straggler).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from labkit.config.metrics import RankMetrics

_RAW = ("role", "server", "worker", "grad_staleness", "grad_worker", "update_t_s",
        "update_loss", "pull_wait_s", "clock_gaps")


@dataclass
class PSMetrics(RankMetrics):
    """One rank of a parameter-server run: a server's log of updates, or a worker's waits."""

    role: str | None = None
    """server or worker."""
    server: int | None = None
    """Server index (0..S-1); servers only."""
    grad_staleness: list[int] | None = None
    """Per applied gradient, in arrival order: version applied minus version read."""
    grad_worker: list[int] | None = None
    """Per applied gradient: the worker index (0..W-1) that pushed it."""
    update_t_s: list[float] | None = None
    """Per update: seconds since this server's first request when it was applied."""
    update_loss: list[float] | None = None
    """Per update: the mean training loss of the gradients it applied."""
    worker: int | None = None
    """Worker index (0..W-1); workers only."""
    pull_wait_s: float | None = None
    """Seconds this worker spent in pulls (waiting for the server's answer included)."""
    clock_gaps: list[int] | None = None
    """Per answered pull, in order: the reader's clock minus the slowest worker's; servers."""

    @classmethod
    def combine(cls, records: Sequence[RankMetrics], config: Any) -> dict[str, Any]:
        out = {k: v for k, v in super().combine(records, config).items() if k not in _RAW}
        ps = [r for r in records if isinstance(r, PSMetrics)]
        servers = sorted((r for r in ps if r.role == "server"), key=lambda r: r.server or 0)
        workers = sorted((r for r in ps if r.role == "worker"), key=lambda r: r.worker or 0)
        opts = config.options
        out.update(consistency=opts.consistency, servers=len(servers), workers=len(workers))
        if opts.consistency == "ssp":
            out.update(staleness_bound=opts.bound, bound_unit="clocks")
        elif opts.consistency == "bounded-delay":
            out.update(delay_bound=opts.bound, bound_unit="updates")
        out.update(staleness_stats([s.grad_staleness or [] for s in servers],
                                   [s.grad_worker or [] for s in servers], len(workers)))
        gaps = [g for s in servers for g in s.clock_gaps or []]
        out["clock_gap_hist"] = histogram(gaps)
        out["max_clock_gap"] = max(gaps, default=0)
        if servers:
            first = servers[0]
            times, losses = first.update_t_s or [], first.update_loss or []
            out["updates"] = len(times)
            out["updates_per_s"] = len(times) / times[-1] if times and times[-1] > 0 else 0.0
            out["loss_per_update"] = list(losses)
            out["loss_vs_time"] = [[round(t, 6), v] for t, v in zip(times, losses)]
        out["pull_wait_s_per_worker"] = [w.pull_wait_s or 0.0 for w in workers]
        return out


def staleness_stats(per_server: list[list[int]], workers_of: list[list[int]],
                    workers: int) -> dict[str, Any]:
    """Histogram, max, mean and per-worker mean of the staleness of every applied gradient."""
    every = [s for server in per_server for s in server]
    hist = histogram(every)
    by_worker: list[list[int]] = [[] for _ in range(workers)]
    for stal, who in zip(per_server, workers_of):
        for s, w in zip(stal, who):
            by_worker[w].append(s)
    return {"staleness_hist": hist, "max_staleness": max(every, default=0),
            "mean_staleness": statistics.fmean(every) if every else 0.0,
            "mean_staleness_per_worker": [statistics.fmean(v) if v else 0.0 for v in by_worker]}


def histogram(values: Sequence[int]) -> list[int]:
    """Index k holds how many of ``values`` equal k (``[0]`` when there are none)."""
    hist = [0] * (max(values, default=0) + 1)
    for v in values:
        hist[v] += 1
    return hist


def smoothed(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over the last ``window`` values (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def time_to_loss(metrics: dict[str, Any], target: float, grads: int = 12) -> float | None:
    """Seconds until the loss, averaged over the last ``grads`` gradients, first falls to
    ``target`` or below (None: never). ``metrics`` are a ps run's metrics.

    One ASP update is one worker's gradient, one BSP update the mean of all workers' (its
    loss is already an average), so the window is ``grads`` updates for ASP / SSP and
    ``grads / workers`` updates for BSP: both curves are smoothed over the same samples, and
    one lucky small batch never counts as having reached the target.
    """
    pairs = metrics["loss_vs_time"]
    per_update = metrics["workers"] if metrics["consistency"] == "bsp" else 1
    window = max(1, round(grads / per_update))
    losses = smoothed([float(v) for _, v in pairs], window)
    for i, ((t, _), v) in enumerate(zip(pairs, losses)):
        if i + 1 >= window and v <= target:
            return float(t)
    return None
