"""Gradient compression as DDP comm hooks (lesson 06). Torch-free: options and registration.

``labkit run compress --method powersgd`` trains the seeded MLP with torch's
DistributedDataParallel and replaces each bucket's all-reduce by a compressed exchange:
fp16 / bf16 casts (torch's ``fp16_compress_wrapper`` / ``bf16_compress_wrapper``), PowerSGD
(Vogels et al. 2019, torch's ``powerSGD_hook``) or our top-k sparsification with error
feedback (Stich et al. 2018; Lin et al. 2018, "Deep Gradient Compression"), our random-k
(k positions drawn from a seed every rank shares, so only values travel; Stich et al.
2018) and 8-bit quantisation (a shared scale, int8 values summed in the all-reduce; seed
002's "quantise"). Every byte still goes through ``labkit.trace.comm``, so the bytes on the wire
are read from the trace.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.base.errors import ConfigError
from labkit.config.registry import Strategy, register
from labkit.strategies.dp import DPMetrics

METHODS = ("none", "fp16", "bf16", "powersgd", "topk", "randomk", "int8")


@dataclass(kw_only=True, frozen=True)
class CompressionOptions:
    """Which compression the DDP comm hook applies, and its knobs."""

    method: str = "none"
    """none (plain all-reduce), fp16, bf16, powersgd, topk, randomk or int8."""
    rank: int = 2
    """PowerSGD matrix approximation rank r (each m x n gradient is sent as (m + n) x r)."""
    topk_ratio: float = 0.01
    """Top-k: share of gradient values each rank sends per bucket (0 < ratio <= 1)."""
    randomk_ratio: float = 0.01
    """Random-k: share of gradient values all-reduced per bucket (0 < ratio <= 1)."""
    bucket_cap_mb: float = 25.0
    """DDP gradient bucket size in MB."""
    powersgd_start_step: int = 2
    """PowerSGD all-reduces uncompressed before this step (torch requires >= 2 with error feedback)."""

    def __post_init__(self) -> None:
        problems = []
        if self.method not in METHODS:
            problems.append(f"method {self.method!r} must be one of {', '.join(METHODS)}; "
                            "e.g. method='fp16'")
        if self.rank < 1:
            problems.append(f"rank ({self.rank}) must be >= 1, e.g. rank=2")
        if not 0 < self.topk_ratio <= 1:
            problems.append(f"topk_ratio ({self.topk_ratio}) must be in (0, 1], e.g. 0.01")
        if not 0 < self.randomk_ratio <= 1:
            problems.append(f"randomk_ratio ({self.randomk_ratio}) must be in (0, 1], e.g. 0.01")
        if not self.bucket_cap_mb > 0:
            problems.append(f"bucket_cap_mb ({self.bucket_cap_mb}) must be > 0 MB, e.g. 25")
        if self.powersgd_start_step < 2:
            problems.append(f"powersgd_start_step ({self.powersgd_start_step}) must be >= 2 "
                            "(torch's PowerSGD with error feedback); e.g. 2")
        if problems:
            raise ConfigError(problems)


@dataclass
class CompressionMetrics(DPMetrics):
    """Bytes on the wire per step, read off this rank's trace, beside the prediction."""

    method: str | None = None
    payload_bytes_per_step: list[int] | None = None
    wire_bytes_per_step: list[float] | None = None
    predicted_payload_bytes: float | None = None
    predicted_wire_bytes: float | None = None
    uncompressed_wire_bytes: float | None = None
    compression_ratio: float | None = None
    """Uncompressed wire bytes / this method's wire bytes (steady state)."""
    grad_bytes: int | None = None


register(Strategy(
    name="compress", entry="labkit.strategies.compression.impl:train",
    options=CompressionOptions,
    summary="DDP with a compressing comm hook (fp16, bf16, PowerSGD, top-k, random-k, int8)",
    lesson="06_communication"))
