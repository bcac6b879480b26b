"""Scaling the batch (lesson 02): data parallelism with the large-batch toolkit.

Options for the learning-rate scaling rule (none / linear / sqrt, Goyal et al. 2017,
"Accurate, Large Minibatch SGD"), linear warmup, gradient clipping, gradient accumulation
and checkpointing. LARS and LAMB are chosen with the common ``optimizer`` setting.
Torch-free: options and registration only; the rank code is in ``impl``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labkit.base.errors import ConfigError
from labkit.config.metrics import RankMetrics
from labkit.config.registry import Strategy, register
from labkit.train.checkpoint import CheckpointOptions

LR_RULES = ("none", "linear", "sqrt")
DATASET_SAMPLES = 8192  # labkit.train.training.SyntheticTask's default size


@dataclass(kw_only=True, frozen=True)
class ScalingOptions(CheckpointOptions):
    """How the learning rate follows the global batch, and what keeps large batches stable."""

    lr_rule: str = "none"
    """none (use lr as given), linear or sqrt: scale lr from base_batch to the global batch."""
    base_batch: int = 0
    """Global batch (samples) at which lr was tuned; 0 means batch_size (1 rank, no accumulation)."""
    warmup_steps: int = 0
    """Steps of linear warmup from 0 to the (scaled) lr; 0: no warmup."""
    clip_grad_norm: float = 0.0
    """Clip the global gradient norm to this value before the update; 0: no clipping."""
    accumulation: int = 1
    """Micro-batches per rank summed before each optimizer step (global batch x accumulation)."""

    def __post_init__(self) -> None:
        problems = []
        if self.lr_rule not in LR_RULES:
            problems.append(f"lr_rule {self.lr_rule!r} must be one of {', '.join(LR_RULES)}; "
                            f"e.g. lr_rule='linear'")
        if self.base_batch < 0:
            problems.append(f"base_batch ({self.base_batch}) must be >= 0 samples "
                            f"(0: batch_size); e.g. base_batch=256")
        if self.warmup_steps < 0:
            problems.append(f"warmup_steps ({self.warmup_steps}) must be >= 0; e.g. 5")
        if not self.clip_grad_norm >= 0:
            problems.append(f"clip_grad_norm ({self.clip_grad_norm}) must be >= 0 "
                            f"(0: off); e.g. 1.0")
        if self.accumulation < 1:
            problems.append(f"accumulation ({self.accumulation}) must be >= 1; e.g. 4")
        problems += self.checkpoint_problems()
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
