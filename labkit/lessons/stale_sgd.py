"""Synchronous vs asynchronous SGD, as a clearly labelled single-process SIMULATION.

In asynchronous SGD (parameter servers, Hogwild-style; Dean et al. 2012) a worker's gradient
was computed on weights that are already ``k`` updates old when it is applied. This module
trains the lesson's seeded MLP in ONE process and applies, at every step, the gradient
computed ``staleness`` steps earlier — the effect of stale gradients without the noise of
real scheduling. Staleness 0 is ordinary synchronous SGD.
"""

from __future__ import annotations

from collections import deque

import torch
from torch import nn

from labkit.config.run import ModelConfig
from labkit.train.data import SyntheticTask
from labkit.train.models import build_mlp


def stale_sgd_losses(staleness: list[int], steps: int = 40, lr: float = 0.2,
                     batch_size: int = 64, seed: int = 0,
                     model: ModelConfig | None = None) -> dict[int, list[float]]:
    """SIMULATION: loss per step of SGD whose applied gradient is ``k`` steps old, per k."""
    cfg = model or ModelConfig(width=64, depth=2)
    task = SyntheticTask(seed, cfg.in_dim, cfg.out_dim)
    out: dict[int, list[float]] = {}
    for k in staleness:
        if k < 0:
            raise ValueError(f"staleness ({k}) must be >= 0 steps, e.g. [0, 4]")
        net = build_mlp(cfg, seed)
        params = list(net.parameters())
        queue: deque[list[torch.Tensor]] = deque()
        losses = []
        for step in range(steps):
            x, y = task.batch(step, batch_size)
            loss = nn.functional.cross_entropy(net(x), y)
            grads = torch.autograd.grad(loss, params)
            queue.append([g.detach() for g in grads])
            losses.append(float(loss.detach()))
            if len(queue) > k:  # the gradient computed k steps ago arrives now
                with torch.no_grad():
                    for p, g in zip(params, queue.popleft()):
                        p.sub_(lr * g)
        out[k] = losses
    return out
