"""Activations standing for the output of earlier layers, with random targets (lesson 04).

Tensor parallelism splits the matrices inside a transformer block; what comes before the
blocks does not matter to it. Each step draws a fresh input ``(batch, seq, width)`` ~ N(0, 1)
and a target of the same shape from a generator seeded by (seed, step), and the loss is the
mean squared error. Every rank draws the same batch: tensor-parallel ranks of one replica
see the same samples.
"""

from __future__ import annotations

import torch
from torch import nn

from labkit.train.data.base import Task


class ActivationTask(Task):
    """Seeded random activations and targets, one fresh batch per step, MSE loss."""

    def __init__(self, seed: int, seq: int, width: int):
        self.seed, self.seq, self.width = seed, seq, width

    def batch(self, step: int, global_batch: int, shard: int = 0, shards: int = 1
              ) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 100003 + step)
        cpu = torch.device("cpu")
        x = torch.randn(global_batch, self.seq, self.width, generator=g, device=cpu)
        y = torch.randn(global_batch, self.seq, self.width, generator=g, device=cpu)
        per = global_batch // shards
        return x[shard * per:(shard + 1) * per], y[shard * per:(shard + 1) * per]

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(out, y)

    @property
    def tokens_per_sample(self) -> int:
        return 1
