"""Rank code of the ``scaling`` strategy: data-parallel SGD with the large-batch toolkit.

One optimizer step (phase numbers match the code):
  1. set this step's LR: the target LR from ``labkit.theory.scaled_lr`` (rule and base
     batch from the options), ramped by ``labkit.theory.lr_at_step`` during warmup;
  2. run ``accumulation`` micro-batches, each loss divided by ``accumulation`` so the
     summed gradient is the mean over this rank's samples;
  3. average gradients across ranks with one traced all-reduce of a flat buffer — the
     result is exactly the gradient of the global batch;
  4. clip the global gradient norm (``clip_grad_norm_``), then step the optimizer;
  5. save a sharded checkpoint every ``checkpoint_every`` steps.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from labkit.checkpoint import Checkpointer
from labkit.events import Op
from labkit.rank import RankContext, RankOutput
from labkit.strategies.scaling import global_batch_of
from labkit.theory import lr_at_step, scaled_lr
from labkit.training import build_mlp, make_optimizer, max_abs_diff, params_sha256, task_for


def target_lr(config: Any) -> float:
    """The LR after the scaling rule (``config.lr`` is the LR tuned at ``base_batch``)."""
    opts = config.options
    if opts.lr_rule == "none":
        return float(config.lr)
    base = opts.base_batch or config.batch_size
    return scaled_lr(config.lr, base, global_batch_of(config), rule=opts.lr_rule)


def lr_for_step(config: Any, step: int) -> float:
    return lr_at_step(step, target_lr=target_lr(config),
                      warmup_steps=config.options.warmup_steps)


def _set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr


def train(ctx: RankContext) -> RankOutput:
    assert ctx.config is not None
    return train_loop(ctx, ctx.config)


def run_variants(ctx: RankContext, configs: list[Any]) -> list[dict[str, Any]]:
    """Train several configs one after the other on the same ranks (``labkit.launch``).

    Each variant starts from the same seeded model, so the result equals separate runs; the
    lesson uses it to pay process start-up once instead of once per variant.
    """
    results = []
    for cfg in configs:
        out = train_loop(ctx, cfg)
        results.append({"losses": out.losses, **out.extra, **out.metrics,
                        "params_sha256": out.params_sha256})
    return results


def train_loop(ctx: RankContext, cfg: Any) -> RankOutput:
    opts = cfg.options
    model = build_mlp(cfg.model, cfg.seed).to(ctx.device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(cfg.optimizer, params, lr_for_step(cfg, 0) or 1.0)
    task = task_for(cfg)
    gbatch, accum = global_batch_of(cfg), opts.accumulation
    tr = ctx.tracer
    ckpt = Checkpointer(ctx, opts.checkpoint_dir, opts.checkpoint_every, opts.resume, model, opt)
    start, losses = ckpt.start()
    lrs: list[float] = []
    grad_norms: list[float] = []
    for step in range(start, cfg.steps):
        with ctx.step(step):
            # 1. this step's learning rate
            lr = lr_for_step(cfg, step)
            _set_lr(opt, lr)
            opt.zero_grad(set_to_none=True)
            # 2. accumulate micro-batches
            total = 0.0
            for micro in range(accum):
                x, y = task.batch(step, gbatch, ctx.rank * accum + micro, ctx.world_size * accum)
                x, y = x.to(ctx.device), y.to(ctx.device)
                with tr.span(Op.FORWARD, step=step, microbatch=micro):
                    loss = nn.functional.cross_entropy(model(x), y) / accum
                with tr.span(Op.BACKWARD, step=step, microbatch=micro):
                    loss.backward()
                total += loss.item()
            # 3. average gradients over ranks (one flat bucket)
            grads = [p.grad for p in params if p.grad is not None]
            flat = torch.cat([g.reshape(-1) for g in grads])
            ctx.comm.all_reduce(flat, op="avg", step=step)
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
            # 4. clip, then update
            with tr.span(Op.OPTIMIZER, step=step):
                norm = float(torch.linalg.vector_norm(flat))
                if opts.clip_grad_norm > 0:
                    nn.utils.clip_grad_norm_(params, opts.clip_grad_norm)
                opt.step()
            losses.append(total)
            lrs.append(lr)
            grad_norms.append(norm)
        # 5. checkpoint
        ckpt.after_step(step, losses)
    return _output(ctx, cfg, model, losses, lrs, grad_norms, start, ckpt)


def _output(ctx: RankContext, cfg: Any, model: nn.Module, losses: list[float], lrs: list[float],
            grad_norms: list[float], start: int, ckpt: Checkpointer) -> RankOutput:
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    finite = [v for v in losses if math.isfinite(v)]
    out = RankOutput(losses=losses, extra={"lr": lrs, "grad_norm": grad_norms,
                                           "first_step": start})
    out.metrics.update(global_batch=global_batch_of(cfg), target_lr=target_lr(cfg),
                       samples_per_step=global_batch_of(cfg),
                       diverged=len(finite) < len(losses) or bool(
                           finite and losses and finite[-1] > 2 * finite[0]))
    if cfg.options.checkpoint_dir:
        out.metrics.update(ckpt.metrics())
    if ctx.rank == 0:
        out.params_sha256 = params_sha256(state.items())
        if cfg.check_reference:
            out.metrics["max_abs_diff_vs_reference"] = max_abs_diff(state, reference_train(cfg))
    return out


def reference_train(config: Any) -> dict[str, torch.Tensor]:
    """One process, no accumulation: the whole global batch at once, same LR schedule and clip."""
    model = build_mlp(config.model, config.seed)
    opt = make_optimizer(config.optimizer, model.parameters(), lr_for_step(config, 0) or 1.0)
    task, gbatch = task_for(config), global_batch_of(config)
    for step in range(config.steps):
        _set_lr(opt, lr_for_step(config, step))
        x, y = task.batch(step, gbatch)
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        if config.options.clip_grad_norm > 0:
            nn.utils.clip_grad_norm_(model.parameters(), config.options.clip_grad_norm)
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
