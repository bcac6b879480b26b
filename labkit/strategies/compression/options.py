"""Gradient compression's settings, metrics record and registration (``labkit.strategies.compression``).

Torch-free: discovery imports this (through the package) in the supervisor, which validates a
config and builds the CLI flags from it before any process starts; the rank code lives in the
sibling modules and is imported only inside the ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.base.errors import ConfigError
from labkit.base.validate import check_fields, integer, one_of, option, real
from labkit.config.registry import Strategy, register
from labkit.strategies.dp import DPMetrics

METHODS = ("none", "fp16", "bf16", "powersgd", "topk", "randomk", "int8")


@dataclass(kw_only=True, frozen=True)
class CompressionOptions:
    """Which compression the DDP comm hook applies, and its knobs."""

    method: str = option("none", one_of(METHODS, example="fp16"))
    """none (plain all-reduce), fp16, bf16, powersgd, topk, randomk or int8."""
    rank: int = option(2, integer(1, 4096, example=2))
    """PowerSGD matrix approximation rank r (each m x n gradient is sent as (m + n) x r)."""
    topk_ratio: float = option(0.01, real(0, 1, example=0.01))
    """Top-k: share of gradient values each rank sends per bucket (0 < ratio <= 1)."""
    randomk_ratio: float = option(0.01, real(0, 1, example=0.01))
    """Random-k: share of gradient values all-reduced per bucket (0 < ratio <= 1)."""
    bucket_cap_mb: float = option(25.0, real(0, 10_000, unit=" MB", example=25))
    """DDP gradient bucket size in MB."""
    powersgd_start_step: int = option(2, integer(
        2, example=2, why=" (torch's PowerSGD with error feedback)"))
    """PowerSGD all-reduces uncompressed before this step (torch requires >= 2 with error feedback)."""

    def __post_init__(self) -> None:
        problems = check_fields(self)
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
