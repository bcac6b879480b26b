"""Throughput of a run: samples, tokens and model FLOPs per second, and MFU.

``samples_per_s`` = global samples per step / median step time, ``tokens_per_s`` likewise
for language models, and ``mfu`` = model FLOPs per second / this machine's peak matmul
FLOP/s (``labkit.analysis.calibrate``). Model FLOPs count the work of the model itself
(``labkit.theory.training_flops``: forward + backward, about 6 FLOPs per parameter per
sample or token), never recomputation, so MFU compares strategies fairly.
"""

from __future__ import annotations

from typing import Any


def throughput(metrics: dict[str, Any], step_time_s: float, world_size: int,
               backend: str) -> dict[str, Any]:
    """samples_per_s, tokens_per_s and mfu from a run's metrics and its median step time."""
    out: dict[str, Any] = {}
    if step_time_s <= 0:
        return out
    if metrics.get("samples_per_step"):
        out["samples_per_s"] = metrics["samples_per_step"] / step_time_s
    if metrics.get("tokens_per_step"):
        out["tokens_per_s"] = metrics["tokens_per_step"] / step_time_s
    flops = metrics.get("flops_per_step")
    if flops:
        from labkit.analysis.calibrate import machine_peak_flops

        achieved = flops / step_time_s
        peak = machine_peak_flops(backend, world_size)
        out["model_flops_per_s"] = achieved
        if peak:
            out["peak_flops_per_s"] = peak
            out["mfu"] = achieved / peak
    return out
