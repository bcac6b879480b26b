"""Data-parallel strategies (lesson 01). Torch-free: options and registration only."""

from __future__ import annotations

from dataclasses import dataclass

from labkit.base.errors import ConfigError
from labkit.config.registry import Strategy, register
from labkit.train.checkpoint import CheckpointOptions


@dataclass(kw_only=True, frozen=True)
class DDPOptions(CheckpointOptions):
    """Settings of torch's DistributedDataParallel."""

    bucket_cap_mb: float = 25.0
    """Gradient bucket size in MB (torch's default is 25); smaller buckets start comm earlier."""

    def __post_init__(self) -> None:
        problems = []
        if not self.bucket_cap_mb > 0:
            problems.append(f"bucket_cap_mb ({self.bucket_cap_mb}) must be > 0 MB, e.g. 25")
        problems += self.checkpoint_problems()
        if problems:
            raise ConfigError(problems)


register(Strategy(
    name="ddp", entry="labkit.strategies.ddp.torch_ddp:train", options=DDPOptions,
    summary="torch DistributedDataParallel; bucket all-reduces traced through a comm hook",
    lesson="01_data_parallelism"))
