"""Seeded classification data labelled by a fixed random "teacher" MLP (the lessons' default).

Inputs ~ N(0, 1); labels are the argmax of ``tanh(x W1) W2`` for random W1, W2 drawn from the
seed. Nothing is downloaded, any run is reproducible, and the task is learnable (the teacher
is a small MLP) but not trivial.
"""

from __future__ import annotations

import torch

from labkit.train.data.base import Task


class SyntheticTask(Task):
    """Seeded classification data: inputs ~ N(0, 1), labels from a random teacher MLP."""

    def __init__(self, seed: int, in_dim: int, out_dim: int, samples: int = 8192):
        g = torch.Generator().manual_seed(seed + 12345)
        cpu = torch.device("cpu")  # data lives on the CPU; ranks move their shard to a GPU
        self.x = torch.randn(samples, in_dim, generator=g, device=cpu)
        teacher_w1 = torch.randn(in_dim, 64, generator=g, device=cpu) / in_dim ** 0.5
        teacher_w2 = torch.randn(64, out_dim, generator=g, device=cpu) / 8.0
        self.y = (torch.tanh(self.x @ teacher_w1) @ teacher_w2).argmax(dim=1)
        self.seed = seed
