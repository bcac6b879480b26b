"""The all-reduce benchmark run on every rank (``labkit run allreduce-bench``).

Follows nccl-tests (``doc/PERFORMANCE.md``): for each size, ``warmup`` untimed calls, then
``iters`` timed calls; time = the median call (nccl-tests: the mean over many more calls;
see ``time_allreduce``), taken as the slowest rank's (an all-reduce is done only when every
rank is done). algbw = size / time; busbw = algbw x 2(n-1)/n, the
bytes each link really carried, comparable across world sizes. Then an alpha-beta line is
fitted to the measured times (``labkit.theory.fit_alpha_beta``) and its prediction for each
size is reported beside the measurement. Bandwidths in GB/s (1e9 bytes per second).

Each row also keeps the size's fastest call (``fastest_s``, the slowest rank's), and
``alpha_beta_fastest`` is the line fitted to those: a stall on a busy machine only lengthens
a call, so where the medians fit no line (a small message stalled more than a large one),
the fastest calls still may (``labkit.lessons.dedicated.fitted_bench`` falls back on it).
And each row keeps its mean call (``mean_s``): each fit's ``stall_s`` is the mean calls'
average excess over its line, what a step of many calls pays beyond the wire.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from labkit.base.errors import ConfigError
from labkit.rank.context import RankOutput, RunContext
from labkit.strategies.collectives.hierarchical import hierarchical_allreduce
from labkit.strategies.collectives.ring import ALGORITHMS
from labkit.theory import busbw, fit_alpha_beta


def _one_call(ctx: RunContext, impl: str, tensor: torch.Tensor, step: int) -> None:
    if impl == "builtin":
        ctx.comm.all_reduce(tensor, step=step)
    elif impl == "hierarchical":
        intra, inter = ctx.node_comms()
        hierarchical_allreduce(intra, inter, tensor, step=step)
    else:
        ALGORITHMS[impl](ctx.comm, tensor, step=step)


def time_allreduce(ctx: RunContext, impl: str, size_bytes: int, iters: int, warmup: int,
                   step: int = 0) -> tuple[float, float, float]:
    """Seconds per all-reduce of ``size_bytes``: the median call, the fastest call and the
    mean call, each the slowest rank's.

    The median, not the mean: on a shared laptop the scheduler stalls one call now and then
    (a few ms, more than a small message takes), and with a handful of iterations one stall
    would double a size's mean -- enough to make small messages look slower than large ones
    and the alpha-beta fit impossible. nccl-tests reports the mean over far more iterations.
    The mean is kept beside it: pooled over every size (``alpha_beta_summary``'s
    ``stall_s``) it says what the stalls add to a call on average, which a step of many
    calls pays.
    """
    tensor = torch.ones(size_bytes // 4, dtype=torch.float32, device=ctx.device)
    # 1. warm up: first messages pay for connection set-up and page faults
    for _ in range(warmup):
        _one_call(ctx, impl, tensor, step)
    # 2. start together, 3. time every call, 4. report the slowest rank's median and fastest
    ctx.comm.barrier(step=step)
    calls = []
    for _ in range(iters):
        t0 = time.perf_counter()
        _one_call(ctx, impl, tensor, step)
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
        calls.append(time.perf_counter() - t0)
    mine = torch.tensor([statistics.median(calls), min(calls), statistics.fmean(calls)],
                        dtype=torch.float64, device=ctx.device)
    ctx.comm.all_reduce(mine, op="max", step=step, name="timing")
    return float(mine[0].item()), float(mine[1].item()), float(mine[2].item())


def results_table(sizes: list[int], times: list[float], world_size: int,
                  fastest: list[float] | None = None,
                  means: list[float] | None = None) -> list[dict[str, Any]]:
    """One row per size: bytes, time_s, algbw_gbps, busbw_gbps (nccl-tests definitions), and
    the fastest and the mean call (``fastest_s``, ``mean_s``) where given."""
    rows = []
    for i, (size, t) in enumerate(zip(sizes, times)):
        alg = size / t
        rows.append({"bytes": size, "time_s": t, "algbw_gbps": alg / 1e9,
                     "busbw_gbps": busbw(alg, world_size, "all_reduce") / 1e9})
        if fastest is not None:
            rows[-1]["fastest_s"] = fastest[i]
        if means is not None:
            rows[-1]["mean_s"] = means[i]
    return rows


def alpha_beta_summary(sizes: list[int], times: list[float], world_size: int,
                       means: list[float] | None = None) -> dict[str, Any] | None:
    """Fitted latency and bandwidth plus the predicted time of every size (None if
    unfittable); with every size's mean call (``means``), ``stall_s``: the mean calls'
    average excess over the fitted line (0 where they sit under it), what a stall adds to a
    call on average (``AlphaBeta.stall_s``)."""
    if world_size < 2 or len(set(sizes)) < 2:
        return None
    try:
        fit = fit_alpha_beta(sizes, times, world_size)
    except ConfigError:
        return None
    stall = (max(0.0, statistics.fmean(m - fit.predict(s) for s, m in zip(sizes, means)))
             if means else 0.0)
    return {"alpha_s": fit.alpha_s, "bandwidth_gbps": fit.bandwidth_Bps / 1e9,
            "r_squared": fit.r_squared, "world_size": world_size,
            "predicted_time_s": [fit.predict(s) for s in sizes], "stall_s": stall}


def train(ctx: RunContext) -> RankOutput:
    cfg = ctx.config
    opts = cfg.options
    sizes = list(opts.sizes_bytes)
    if opts.impl == "hierarchical":
        ctx.node_comms()  # every rank builds the node groups here, before any timing
    times, fastest, means = [], [], []
    for i, size in enumerate(sizes):
        with ctx.step(i):
            median, fast, mean = time_allreduce(ctx, opts.impl, size, opts.iters, opts.warmup,
                                                step=i)
        times.append(median)
        fastest.append(fast)
        means.append(mean)
    out = RankOutput()
    out.metrics.update(impl=opts.impl, ranks_per_node=ctx.node_size,
                       results=results_table(sizes, times, ctx.world_size, fastest, means),
                       alpha_beta=alpha_beta_summary(sizes, times, ctx.world_size, means),
                       alpha_beta_fastest=alpha_beta_summary(sizes, fastest, ctx.world_size,
                                                             means))
    return out
