"""Hand-written data parallelism's settings, metrics record and registration (``labkit.strategies.dp``).

Torch-free: discovery imports this (through the package) in the supervisor, which validates a
config and builds the CLI flags from it before any process starts; the rank code lives in the
sibling modules and is imported only inside the ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from labkit.base.errors import ConfigError
from labkit.base.validate import check_fields, option, real
from labkit.config.metrics import RankMetrics
from labkit.config.registry import Strategy, register


@dataclass
class DPMetrics(RankMetrics):
    """What a data-parallel rank reports about its gradient exchange (every DDP variant)."""

    bytes_per_step: int | None = None
    """Gradient bytes one rank all-reduces per step (the payload)."""
    buckets: int | None = None
    """All-reduce messages per step (one per parameter for ddp-naive)."""
    bucket_bytes: list[int] | None = None
    allreduce_calls_per_step: int | None = None
    bucket_params: list[list[str]] | None = None
    """Which parameters each bucket holds, in launch order (last layer first)."""

    REPORTED: ClassVar[tuple[str, ...]] = ("bytes_per_step", "buckets", "bucket_bytes",
                                           "allreduce_calls_per_step")

    @classmethod
    def report_lines(cls, metrics: dict[str, Any]) -> list[str]:
        m = metrics
        if "bytes_per_step" not in m:
            return []
        hidden = m.get("overlap_fraction", 0.0)
        return [f"  gradients     {m['bytes_per_step'] / 1e6:.3f} MB all-reduced per step in "
                f"{m.get('buckets', '?')} bucket(s); {100 * hidden:.0f}% of that communication "
                f"overlapped the backward pass"]


@dataclass(kw_only=True, frozen=True)
class BucketedOptions:
    """Settings of our bucketed, overlapped DDP."""

    bucket_cap_mb: float = option(1.0, real(0, 10_000, unit=" MB", example=1))
    """Bucket size in MB (1e6 bytes; torch DDP's default is 25, which would hold the whole
    lesson model in one bucket); smaller buckets start comm earlier."""

    def __post_init__(self) -> None:
        problems = check_fields(self)
        if problems:
            raise ConfigError(problems)


register(Strategy(
    name="ddp-naive", entry="labkit.strategies.dp.naive:train",
    summary="hand-written DDP: one blocking all-reduce per parameter after backward",
    lesson="01_data_parallelism"))
register(Strategy(
    name="ddp-bucketed", entry="labkit.strategies.dp.bucketed:train", options=BucketedOptions,
    summary="hand-written DDP: reverse-order buckets, async all-reduce overlapped with backward",
    lesson="01_data_parallelism",
    defaults={"model": {"mlp": {"width": 512, "depth": 8}}}))  # several buckets to overlap
