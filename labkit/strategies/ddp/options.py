"""Torch DDP's settings, metrics record and registration (``labkit.strategies.ddp``).

Torch-free: discovery imports this (through the package) in the supervisor, which validates a
config and builds the CLI flags from it before any process starts; the rank code lives in the
sibling modules and is imported only inside the ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.base.errors import ConfigError
from labkit.base.validate import check_fields, one_of, option, real
from labkit.config.registry import Strategy, register
from labkit.train.checkpoint import CheckpointOptions


@dataclass(kw_only=True, frozen=True)
class DDPOptions(CheckpointOptions):
    """Settings of torch's DistributedDataParallel."""

    bucket_cap_mb: float = option(25.0, real(0, 10_000, unit=" MB", example=25))
    """Gradient bucket size in MB (torch's default is 25); smaller buckets start comm earlier."""
    precision: str = option("fp32", one_of(("fp32", "bf16"), example="bf16"))
    """fp32, or bf16 mixed precision: the forward under ``torch.autocast`` in bfloat16 (the
    weights, gradients and Adam state stay fp32), MFU then against the bf16 matmul peak.
    On a GPU's tensor cores bf16 is the rate a datasheet quotes; on a CPU it is slower."""

    def __post_init__(self) -> None:
        problems = check_fields(self) + self.checkpoint_problems()
        if problems:
            raise ConfigError(problems)


register(Strategy(
    name="ddp", entry="labkit.strategies.ddp.torch_ddp:train", options=DDPOptions,
    summary="torch DistributedDataParallel; bucket all-reduces traced through a comm hook",
    lesson="01_data_parallelism"))
