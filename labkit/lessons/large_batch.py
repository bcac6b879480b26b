"""Rank code of lesson 02's large-batch runs (start them with ``labkit.launch``).

* ``train_dp``: data-parallel training written out -- each rank's shard of the step's
  batch, one traced all-reduce of the flat gradients, the optimizer's step. The same buffer
  carries each rank's local squared gradient norm, so every step also yields the two
  gradient norms McCandlish et al. 2018 (Appendix A.1) need for the noise scale: the local
  gradient is the small batch, the all-reduced one the big batch.
* ``noise_scale_run``: the lesson's model trained with SGD, recording those norms.
* ``layerwise_race``: momentum SGD against LARS (You et al. 2017) at a small and a large
  batch, each LR linearly scaled from the small one, on the lesson's model stored with
  layers of very different scale: layer 1 ``scale`` times larger and layer 2 ``scale``
  times smaller (biases off), the same function as the plain model because ReLU is
  positively homogeneous. SGD's step depends on that storage; LARS's does not.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import nn

from labkit.config.run import ModelConfig
from labkit.lessons.scaling import LESSON_MODEL
from labkit.rank.context import RankContext
from labkit.theory import lr_at_step
from labkit.train.data.synthetic import SyntheticTask
from labkit.train.models import build_mlp
from labkit.train.optim import LARS


def lesson_problem(seed: int = 0, model: ModelConfig = LESSON_MODEL
                   ) -> tuple[nn.Sequential, SyntheticTask]:
    """The lesson's MLP and its synthetic task, identical on every rank for ``seed``."""
    return build_mlp(model, seed), SyntheticTask(seed, model.in_dim, model.out_dim)


def layered_model(seed: int = 0, scale: float = 10.0) -> nn.Sequential:
    """The lesson's MLP without biases, layer 1 stored ``scale`` x larger and layer 2
    ``scale`` x smaller: ``relu(s W1 x) W2 / s`` is the plain model's function exactly."""
    net, _ = lesson_problem(seed)
    linears = [m for m in net if isinstance(m, nn.Linear)]
    with torch.no_grad():
        for lin in linears:
            lin.bias.zero_()
            lin.bias.requires_grad_(False)
        linears[0].weight.mul_(scale)
        linears[1].weight.div_(scale)
    return net


def train_dp(ctx: RankContext, model: nn.Module, task: SyntheticTask,
             make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer], *,
             steps: int, per_rank_batch: int, lr: float, warmup_steps: int = 0
             ) -> dict[str, Any]:
    """Data-parallel training of ``model``; returns the mean loss per step, the two squared
    gradient norms per step (local, averaged over ranks; global) and the final weights."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(params)
    batch = per_rank_batch * ctx.world_size
    losses: list[float] = []
    local_sq: list[float] = []
    global_sq: list[float] = []
    for step in range(steps):
        for group in opt.param_groups:  # 1. this step's LR (linear warmup, then the target)
            group["lr"] = lr_at_step(step, target_lr=lr, warmup_steps=warmup_steps)
        # 2. this rank's shard of the step's global batch
        x, y = task.batch(step, batch, ctx.rank, ctx.world_size)
        opt.zero_grad()
        loss = task.loss(model(x), y)
        loss.backward()
        # 3. one all-reduce: the gradients, this rank's |g|^2 and its loss, averaged
        flat = torch.cat([p.grad.reshape(-1) for p in params])  # type: ignore[union-attr]
        buf = torch.cat([flat, (flat @ flat).view(1), loss.detach().view(1)])
        ctx.comm.all_reduce(buf, op="avg", step=step)
        offset = 0
        for p in params:
            p.grad.copy_(buf[offset:offset + p.numel()].view_as(p))  # type: ignore[union-attr]
            offset += p.numel()
        mean = buf[:offset]
        local_sq.append(float(buf[-2]))
        global_sq.append(float(mean @ mean))
        losses.append(float(buf[-1]))
        # 4. the update, identical on every rank
        opt.step()
    return {"losses": losses, "local_sq": local_sq, "global_sq": global_sq,
            "per_rank_batch": per_rank_batch, "global_batch": batch,
            "weights": [p.detach().clone() for p in model.parameters()]}


def noise_scale_run(ctx: RankContext, steps: int = 120, per_rank_batch: int = 32,
                    lr: float = 0.8, seed: int = 0) -> dict[str, Any]:
    """The lesson's model, plain SGD on ``world_size`` ranks, recording the noise norms."""
    model, task = lesson_problem(seed)
    out = train_dp(ctx, model, task, lambda ps: torch.optim.SGD(ps, lr=lr), steps=steps,
                   per_rank_batch=per_rank_batch, lr=lr)
    del out["weights"]
    return out


def make_race_optimizer(name: str, params: list[nn.Parameter], *, lr: float) -> torch.optim.Optimizer:
    """Momentum SGD (0.9) or labkit's LARS (momentum 0.9, eta 0.001)."""
    if name == "lars":
        return LARS(params, lr=lr)
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def layerwise_race(ctx: RankContext, runs: list[dict[str, Any]], scale: float = 10.0
                   ) -> list[dict[str, Any]]:
    """Each of ``runs`` (optimizer, seed, per_rank_batch, steps, lr, warmup_steps) from the
    same layered model of its seed; returns the mean loss per step of each."""
    results = []
    for run in runs:
        model = layered_model(run["seed"], scale)
        task = SyntheticTask(run["seed"], LESSON_MODEL.in_dim, LESSON_MODEL.out_dim)
        name, lr = run["optimizer"], run["lr"]
        out = train_dp(ctx, model, task, partial(make_race_optimizer, name, lr=lr),
                       steps=run["steps"], per_rank_batch=run["per_rank_batch"], lr=lr,
                       warmup_steps=run["warmup_steps"])
        results.append({**run, "losses": out["losses"], "global_batch": out["global_batch"]})
    return results
