"""The single-process reference a pipeline run is checked against.

What this pins down: splitting a batch into M microbatches, running them through stages on
different ranks in any valid order, and summing ``loss_m / M`` gives exactly the gradient of
the whole batch on one device -- only floating-point summation order differs. One process
trains the same seeded model on the same batches; each rank compares the gradients (first
step), losses and final weights of the layers it owns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from labkit.config.run import RunConfig
from labkit.strategies.pipeline import options_for
from labkit.strategies.pipeline.model import StageModule, build_full
from labkit.train.training import make_optimizer, task_for


def reference_run(cfg: RunConfig) -> tuple[dict[str, torch.Tensor], list[float],
                                           dict[str, torch.Tensor]]:
    """One process, whole batch: (first-step gradients, losses per step, final weights)."""
    opts = options_for(cfg)
    full = build_full(cfg.model, opts.layer_costs, cfg.seed)
    opt = make_optimizer(cfg.optimizer, full.parameters(), cfg.lr)
    task = task_for(cfg)
    grads: dict[str, torch.Tensor] = {}
    losses: list[float] = []
    for step in range(cfg.steps):
        x, y = task.batch(step, cfg.batch_size)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(full(x), y)
        loss.backward()
        losses.append(float(loss.detach()))
        if step == 0:
            grads = {n: p.grad.detach().clone() for n, p in full.named_parameters()
                     if p.grad is not None}
        opt.step()
    return grads, losses, {k: v.detach().clone() for k, v in full.state_dict().items()}


def reference_check(cfg: RunConfig, modules: dict[int, StageModule], records: Sequence[Any],
                    first_grads: dict[str, torch.Tensor]) -> dict[str, float]:
    """Max abs differences of this rank's gradients, losses and weights vs the reference."""
    grads, losses, weights = reference_run(cfg)
    d_grad = max((float((g - grads[n]).abs().max()) for n, g in first_grads.items()),
                 default=0.0)
    d_w = 0.0
    for mod in modules.values():
        for n, p in zip(mod.param_names(), mod.parameters()):
            d_w = max(d_w, float((p.detach().cpu() - weights[n]).abs().max()))
    mine = [r.loss for r in records if r.loss is not None]
    d_loss = max((abs(a - b) for a, b in zip(mine, losses)), default=0.0)
    return {"max_abs_diff_grads": d_grad, "max_abs_diff_vs_reference": d_w,
            "max_abs_diff_loss": d_loss}
