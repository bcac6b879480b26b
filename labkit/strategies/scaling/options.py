"""The batch-scaling strategy's settings, metrics record and registration (``labkit.strategies.scaling``).

Torch-free: discovery imports this (through the package) in the supervisor, which validates a
config and builds the CLI flags from it before any process starts; the rank code lives in the
sibling modules and is imported only inside the ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labkit.base.errors import ConfigError
from labkit.base.validate import check_fields, integer, one_of, option, real
from labkit.config.metrics import RankMetrics
from labkit.config.registry import Strategy, register
from labkit.train.checkpoint import CheckpointOptions

LR_RULES = ("none", "linear", "sqrt")
DATASET_SAMPLES = 8192  # labkit.train.training.SyntheticTask's default size


@dataclass(kw_only=True, frozen=True)
class ScalingOptions(CheckpointOptions):
    """How the learning rate follows the global batch, and what keeps large batches stable."""

    lr_rule: str = option("none", one_of(LR_RULES, example="linear"))
    """none (use lr as given), linear or sqrt: scale lr from base_batch to the global batch."""
    base_batch: int = option(0, integer(0, example=256, why=" samples (0: batch_size)"))
    """Global batch (samples) at which lr was tuned; 0 means batch_size (1 rank, no accumulation)."""
    warmup_steps: int = option(0, integer(0, example=5))
    """Steps of linear warmup from 0 to the (scaled) lr; 0: no warmup."""
    clip_grad_norm: float = option(0.0, real(0, lo_open=False, example=1.0, why=" (0: off)"))
    """Clip the global gradient norm to this value before the update; 0: no clipping."""
    accumulation: int = option(1, integer(1, 1024, example=4))
    """Micro-batches per rank summed before each optimizer step (global batch x accumulation)."""

    def __post_init__(self) -> None:
        problems = check_fields(self) + self.checkpoint_problems()
        if problems:
            raise ConfigError(problems)


@dataclass
class ScalingMetrics(RankMetrics):
    global_batch: int | None = None
    """batch_size x world_size x accumulation."""
    target_lr: float | None = None
    """The LR after the scaling rule (warmup ramps up to it)."""
    diverged: bool | None = None
    """A loss became NaN/inf, or the last finite loss is over twice the first."""


def global_batch_of(config: Any) -> int:
    """Samples per optimizer step: batch_size x world_size x accumulation."""
    return int(config.batch_size * config.world_size * config.options.accumulation)


def _check(config: Any) -> list[str]:
    g = global_batch_of(config)
    if g > DATASET_SAMPLES:
        return [(f"global batch ({config.batch_size} x {config.world_size} ranks x "
                 f"{config.options.accumulation} accumulation = {g}) must be <= the synthetic "
                 f"dataset ({DATASET_SAMPLES} samples); e.g. batch_size=32, world_size=4")]
    return []


register(Strategy(
    name="scaling", entry="labkit.strategies.scaling.impl:train", options=ScalingOptions,
    summary=("data parallel with LR scaling, warmup, clipping, accumulation, LARS/LAMB, "
             "checkpoints"), check=_check, lesson="02_batch_size_and_lr"))
