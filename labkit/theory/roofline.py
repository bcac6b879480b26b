"""When data parallelism becomes communication-bound: the roofline of one DDP step.

Teaches: a data-parallel step computes for a time that grows with the batch each device
holds, and all-reduces a gradient whose size does not. Per device and step (Kaplan et al.
2020 for the FLOPs; nccl-tests ``doc/PERFORMANCE.md`` for the ring's bytes):

* compute ``6 x params`` FLOPs per sample (per token for a language model: 2 forward, 4
  backward per weight), at ``flops_per_s``: ``t_compute = 6 P b / F``;
* the ring all-reduce of the gradients, ``2(n-1)/n x bytes_per_param x P`` bytes each device
  sends at ``bandwidth_Bps`` per direction: ``t_comm = 2(n-1)/n x k P / B``.

Below the **crossover batch** the all-reduce takes longer than the compute (unless hidden
under backward, the step is communication-bound); above it compute dominates. Setting the
two equal, P cancels::

    b* = 2(n-1)/n x k x F / (6 B)

so the crossover depends on the hardware's ratio of FLOP/s to bytes/s, not on the model.
On an 8-GPU A100 node (312 TFLOP/s dense bf16; NVLink 3 600 GB/s both directions together,
300 GB/s each way) with bf16 gradients (k = 2): b* = 1.75 x 2 x 312e12 / (6 x 300e9) = 607
samples (tokens) per GPU; on H100 SXM (989 TFLOP/s, NVLink 4 at 450 GB/s each way) 1282.
Datasheet peaks: real steps reach a fraction of both (MFU, busbw), which moves b* by the
ratio of the two fractions. Units: FLOP/s, bytes/s, seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from labkit.base.errors import ConfigError
from labkit.theory.batch import check_choice, check_int, check_number
from labkit.theory.comm import ring_allreduce_bytes

FLOPS_PER_PARAM_PER_SAMPLE = 6
"""Training FLOPs per weight and sample (token): 2 forward + 4 backward (Kaplan et al. 2020)."""


@dataclass(frozen=True)
class Accelerator:
    """A GPU's datasheet peak and its node's link, as the roofline reads them."""

    name: str
    flops_per_s: float  # dense bf16 peak, FLOP/s
    bandwidth_Bps: float  # NVLink bandwidth per direction, bytes/s
    note: str = ""


ACCELERATORS: dict[str, Accelerator] = {
    a.name: a for a in (
        Accelerator("A100", 312e12, 300e9, "A100 SXM: 312 TFLOP/s dense bf16; NVLink 3 600 GB/s "
                                           "both directions together = 300 GB/s each way"),
        Accelerator("H100", 989e12, 450e9, "H100 SXM: 989 TFLOP/s dense bf16; NVLink 4 900 GB/s "
                                           "both directions together = 450 GB/s each way"),
    )
}


def dp_compute_time(params: float, batch_per_device: float, flops_per_s: float) -> float:
    """Seconds one device computes per step: ``6 x params x batch / flops_per_s``."""
    p = check_number("params", params, "params=1.3e9")
    b = check_number("batch_per_device", batch_per_device, "batch_per_device=512")
    f = check_number("flops_per_s", flops_per_s, "flops_per_s=312e12", allow_equal=False)
    return FLOPS_PER_PARAM_PER_SAMPLE * p * b / f


def dp_allreduce_time(params: float, world_size: int, bandwidth_Bps: float,
                      bytes_per_param: float = 2.0) -> float:
    """Seconds of the ring all-reduce of the gradients (bandwidth term only):
    ``2(n-1)/n x bytes_per_param x params / bandwidth_Bps``; 0 on one device."""
    p = check_number("params", params, "params=1.3e9")
    n = check_int("world_size", world_size, 1, "world_size=8")
    bw = check_number("bandwidth_Bps", bandwidth_Bps, "bandwidth_Bps=300e9", allow_equal=False)
    k = check_number("bytes_per_param", bytes_per_param, "bytes_per_param=2", allow_equal=False)
    return ring_allreduce_bytes(k * p, n) / bw


def dp_crossover_batch(world_size: int, flops_per_s: float, bandwidth_Bps: float,
                       bytes_per_param: float = 2.0) -> float:
    """The batch per device (samples or tokens) at which compute and the all-reduce take
    equally long: ``2(n-1)/n x bytes_per_param x flops_per_s / (6 x bandwidth_Bps)``.
    Independent of the model size; 0 on one device (nothing to all-reduce)."""
    n = check_int("world_size", world_size, 1, "world_size=8")
    f = check_number("flops_per_s", flops_per_s, "flops_per_s=312e12", allow_equal=False)
    bw = check_number("bandwidth_Bps", bandwidth_Bps, "bandwidth_Bps=300e9", allow_equal=False)
    k = check_number("bytes_per_param", bytes_per_param, "bytes_per_param=2", allow_equal=False)
    return ring_allreduce_bytes(k, n) * f / (FLOPS_PER_PARAM_PER_SAMPLE * bw)


def node_crossover(gpu: str, world_size: int = 8, bytes_per_param: float = 2.0) -> float:
    """``dp_crossover_batch`` on a node of ``world_size`` ``gpu``s (a key of ACCELERATORS)."""
    check_choice("gpu", gpu, tuple(ACCELERATORS), "gpu='A100'")
    a = ACCELERATORS[gpu]
    return dp_crossover_batch(world_size, a.flops_per_s, a.bandwidth_Bps, bytes_per_param)


def dp_roofline(params: float, gpu: str, batches: Sequence[float], world_size: int = 8,
                bytes_per_param: float = 2.0) -> list[dict[str, float | str]]:
    """One row per batch per device: compute and all-reduce seconds on ``world_size``
    ``gpu``s at datasheet peak, and which one bounds the step (no overlap)."""
    check_choice("gpu", gpu, tuple(ACCELERATORS), "gpu='A100'")
    if not batches:
        raise ConfigError("batches ([]) must hold at least one batch size; e.g. [128, 512, 2048]")
    a = ACCELERATORS[gpu]
    comm = dp_allreduce_time(params, world_size, a.bandwidth_Bps, bytes_per_param)
    rows: list[dict[str, float | str]] = []
    for b in batches:
        compute = dp_compute_time(params, b, a.flops_per_s)
        rows.append({"batch_per_device": float(b), "compute_s": compute, "allreduce_s": comm,
                     "bound": "compute" if compute >= comm else "communication"})
    return rows
