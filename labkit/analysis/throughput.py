"""Throughput of a run: samples, tokens and model FLOPs per second, and MFU.

``samples_per_s`` = global samples per step / median step time, ``tokens_per_s`` likewise
for language models, and ``mfu`` = model FLOPs per second / this machine's peak matmul
FLOP/s (``labkit.analysis.calibrate``). Model FLOPs count the work of the model itself
(``labkit.theory.training_flops``: 6 N + 12 L h s per token, PaLM's appendix B), never
recomputation, so MFU compares strategies fairly.

The peak is the one the run could use: the best matmul rate of one rank -- its threads (CPU)
or its GPU (NCCL) -- times the ranks that can run at once (all of them on GPUs; on a CPU as
many as its cores hold at that many threads each), over square sizes, measured once per
machine and cached. One rank's rate times the ranks, not one process with all their threads:
torch's bf16 matmul on a CPU without AVX-512 BF16 runs on one thread whatever it is given
(2 threads: 1.35 GFLOP/s, 1 thread: 1.35, on the AVX2 host of docs/benchmarks.md), so a
2-thread peak was one core's, and two 1-thread ranks "beat" it and paid a new calibration on
every run. For fp32 the two agree (72 GFLOP/s on 1 thread, 146 on 2, there). The model's
own GEMM shapes (``gemm_shapes``) are measured too only where the run
went faster than that. A skinny model matmul seldom beats the squares, and measuring every
new model's shapes cost each new batch size, width or world size a calibration of its own
(about 5 s of a fresh process and 7 CPU-seconds each here): one pass of the lessons on a
fresh 2-core machine measured 154 model shapes. The metrics say which peak it was: ``peak_flops_per_s``,
``peak_source``, ``peak_age_s`` (and ``peak_shape``, ``peak_threads`` of one rank,
``peak_processes`` the ranks it was multiplied by, ``peak_busy``).
A model rate above the peak cannot be: the peak was measured too low (a busy machine), so
it is measured again (``peak_source`` says so); if the model still beats it, ``mfu`` is left
out and ``mfu_note`` says why, rather than reporting MFU above 1. Neither is a warning: a run
that did not ask for MFU (most lessons' runs) would show a red box about a number nobody
reads, and where MFU is shown (lesson 09, the GPU self-test) the note is shown in its place.
"""

from __future__ import annotations

import time
from typing import Any

from labkit.base import devices

Shape = tuple[int, int, int]


def gemm_shapes(config: Any, world_size: int) -> list[Shape]:
    """The matmuls one rank's model does per step, (m, k, n) each: forward ``x W``, the input
    gradient and the weight gradient of every distinct layer shape (MLP, digits, GPT)."""
    model = getattr(config, "model", None)
    if model is None:
        return []
    rows = max(1, int(config.batch_size or 32) // max(1, world_size))
    if model.kind == "gpt":
        h, v = model.width, model.vocab_size or 256
        rows *= model.seq_len
        layers = [(h, 3 * h), (h, h), (h, 4 * h), (4 * h, h), (h, v)]
    else:
        layers = [(model.in_dim, model.width), (model.width, model.width),
                  (model.width, model.out_dim)]
    out: set[Shape] = set()
    for k, n in layers:
        out |= {(rows, k, n), (rows, n, k), (k, rows, n)}  # forward, dx, dW
    return sorted(s for s in out if min(s) >= 8)


def machine_peak(backend: str, world_size: int, threads: int, shapes: list[Shape],
                 refresh: bool = False, dtype: str = "fp32", progress: bool | None = None
                 ) -> dict[str, Any] | None:
    """The peak a run could use and where it came from (``calibrate.summarize``'s fields),
    in the run's precision (``dtype``: fp32, or bf16 for a mixed-precision run). A shape
    not cached yet is measured now, with ``progress`` as the run's (``RunConfig.progress``)."""
    from labkit.analysis.calibrate import calibrate

    if backend == "nccl":  # one GPU per rank
        one = calibrate("cuda", shapes=shapes, refresh=refresh, dtype=dtype, progress=progress)
        at_once = world_size
    else:  # one rank's threads, as many ranks as the cores hold at once
        per_rank = max(1, min(devices.cpu_count(), threads))
        at_once = max(1, min(world_size, devices.cpu_count() // per_rank))
        one = calibrate("cpu", threads=per_rank, shapes=shapes, refresh=refresh, dtype=dtype,
                        progress=progress)
    if not one:
        return None
    return {**one, "peak_flops_per_s": one["peak_flops_per_s"] * at_once, "processes": at_once}


def _peak_fields(peak: dict[str, Any], source: str) -> dict[str, Any]:
    return {"peak_flops_per_s": peak["peak_flops_per_s"], "peak_source": source,
            "peak_age_s": max(0.0, time.time() - peak.get("measured_at", time.time())),
            "peak_shape": peak.get("shape"), "peak_threads": peak.get("threads"),
            "peak_processes": peak.get("processes", 1), "peak_busy": peak.get("busy")}


def mfu_fields(achieved: float, backend: str, world_size: int, threads: int,
               shapes: list[Shape], dtype: str = "fp32", progress: bool | None = None
               ) -> dict[str, Any]:
    """``mfu`` and the peak it used; a peak below ``achieved`` is measured again first
    (``progress``: whether a measurement shows progress, as ``RunConfig.progress``), which
    ``peak_source`` says. Where even the new peak is below the run, ``mfu_note`` replaces
    ``mfu``: no warning, since lessons 03 and 10 showed red boxes for an MFU they never
    print (a busy machine measures its peak low)."""
    peak = machine_peak(backend, world_size, threads, [], dtype=dtype, progress=progress)
    if not peak or peak["peak_flops_per_s"] <= 0:
        return {}
    if achieved > peak["peak_flops_per_s"] and shapes:  # the model's own shapes may beat it
        own = machine_peak(backend, world_size, threads, shapes, dtype=dtype, progress=progress)
        if own and own["peak_flops_per_s"] > 0:
            peak = own
    what = f"{dtype} torch.mm, best of {len(peak.get('rates') or {})} shapes"
    if peak.get("processes", 1) > 1:
        what += f", x {peak['processes']} ranks"
    source = f"{what}, " + ("measured now" if peak.get("fresh") else "cached") + \
        (" (on a busy machine)" if peak.get("busy") else "")
    low = peak["peak_flops_per_s"]
    if achieved > low:
        again = machine_peak(backend, world_size, threads, shapes, refresh=True, dtype=dtype,
                             progress=progress)
        if again and again["peak_flops_per_s"] > 0:
            peak = again
            source = f"{what}, measured again: the model ran at {achieved / 1e9:.1f} GFLOP/s, " \
                     f"above the cached peak {low / 1e9:.1f}"
    out = _peak_fields(peak, source)
    if achieved <= peak["peak_flops_per_s"]:
        out["mfu"] = achieved / peak["peak_flops_per_s"]
    else:
        out["mfu_note"] = (f"not reported: the model ran at {achieved / 1e9:.1f} GFLOP/s, "
                           f"above the cached peak {low / 1e9:.1f} and above even the peak "
                           f"measured again ({peak['peak_flops_per_s'] / 1e9:.1f}): the "
                           f"machine is too busy to measure its peak now; `labkit calibrate` "
                           f"on a quiet machine gives a trustworthy one")
    return out


def throughput(metrics: dict[str, Any], step_time_s: float, config: Any, backend: str,
               threads: int) -> dict[str, Any]:
    """samples_per_s, tokens_per_s and mfu (with the peak it used) from a run's metrics,
    its median step time, its config and its torch threads per rank."""
    out: dict[str, Any] = {}
    if step_time_s <= 0:
        return out
    if metrics.get("samples_per_step"):
        out["samples_per_s"] = metrics["samples_per_step"] / step_time_s
    if metrics.get("tokens_per_step"):
        out["tokens_per_s"] = metrics["tokens_per_step"] / step_time_s
    flops = metrics.get("flops_per_step")
    if flops:
        achieved = flops / step_time_s
        out["model_flops_per_s"] = achieved
        dtype = str(getattr(config.options, "precision", "fp32"))
        out.update(mfu_fields(achieved, backend, config.world_size, threads,
                              gemm_shapes(config, config.world_size), dtype=dtype,
                              progress=getattr(config, "progress", None)))
    return out
