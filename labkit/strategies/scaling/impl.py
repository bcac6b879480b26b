"""Rank code of the ``scaling`` strategy: data-parallel SGD with the large-batch toolkit.

``TrainLoop`` with four hooks changed (phase numbers match the code):
  1. set this step's LR: the target LR from ``labkit.theory.scaled_lr`` (rule and base
     batch from the options), ramped by ``labkit.theory.lr_at_step`` during warmup;
  2. run ``accumulation`` micro-batches, each loss divided by ``accumulation`` so the
     summed gradient is the mean over this rank's samples;
  3. average gradients across ranks with one traced all-reduce of a flat buffer — the
     result is exactly the gradient of the global batch;
  4. clip the global gradient norm (``clip_grad_norm_``), then step the optimizer;
  5. save a sharded checkpoint every ``checkpoint_every`` steps (``TrainLoop``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from labkit.base.events import Op
from labkit.rank.context import RankContext, RankOutput, RunContext
from labkit.strategies.scaling import ScalingMetrics, global_batch_of
from labkit.theory import lr_at_step, scaled_lr
from labkit.train.loop import TrainLoop
from labkit.train.models import build_model
from labkit.train.optim import make_optimizer
from labkit.train.reference import reference_run


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


class ScalingLoop(TrainLoop[ScalingMetrics]):
    Record = ScalingMetrics

    def __init__(self, ctx: RankContext, cfg: Any):
        model = build_model(cfg).to(ctx.device)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = make_optimizer(cfg.optimizer, params, lr_for_step(cfg, 0) or 1.0)
        super().__init__(ctx, model, params=params, optimizer=opt, clock=False, config=cfg)
        self.lrs: list[float] = []
        self.grad_norms: list[float] = []
        self._flat: torch.Tensor | None = None

    def global_batch(self) -> int:
        return global_batch_of(self.cfg)

    def begin_step(self, step: int) -> None:
        # 1. this step's learning rate
        self.lrs.append(lr_for_step(self.cfg, step))
        _set_lr(self.optimizer, self.lrs[-1])

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, step: int) -> float:
        # 2. accumulate micro-batches (this rank's block of the batch, in equal pieces)
        accum, tr, total = self.cfg.options.accumulation, self.ctx.tracer, 0.0
        for micro, (xm, ym) in enumerate(zip(x.chunk(accum), y.chunk(accum))):
            with tr.span(Op.FORWARD, step=step, microbatch=micro):
                loss = self.loss(self.model(xm), ym) / accum
            with tr.span(Op.BACKWARD, step=step, microbatch=micro):
                loss.backward()
            total += loss.item()
        return total

    def sync(self, step: int) -> None:
        # 3. average gradients over ranks (one flat bucket)
        grads = [p.grad for p in self.params if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self.ctx.dp_comm.all_reduce(flat, op="avg", step=step)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        self._flat = flat

    def update(self, step: int) -> None:
        # 4. clip, then update
        with self.ctx.tracer.span(Op.OPTIMIZER, step=step):
            assert self._flat is not None
            self.grad_norms.append(float(torch.linalg.vector_norm(self._flat)))
            if self.cfg.options.clip_grad_norm > 0:
                nn.utils.clip_grad_norm_(self.params, self.cfg.options.clip_grad_norm)
            self.optimizer.step()

    def fill_record(self) -> None:
        finite = [v for v in self.losses if math.isfinite(v)]
        self.record.global_batch = global_batch_of(self.cfg)
        self.record.target_lr = target_lr(self.cfg)
        self.record.diverged = len(finite) < len(self.losses) or bool(
            finite and self.losses and finite[-1] > 2 * finite[0])

    def reference_state(self) -> dict[str, torch.Tensor]:
        """One process, no accumulation: the whole global batch at once, the same LR
        schedule and clip."""
        cfg = self.cfg
        return reference_run(cfg, global_batch=global_batch_of(cfg),
                             lr_at=lambda step: lr_for_step(cfg, step),
                             clip_grad_norm=cfg.options.clip_grad_norm).state

    def finish(self) -> RankOutput:
        start = self.checkpointer.resumed_from if self.checkpointer is not None else None
        out = super().finish()
        out.extra.update(lr=self.lrs, grad_norm=self.grad_norms, first_step=start or 0)
        return out


def train(ctx: RunContext) -> RankOutput:
    return ScalingLoop(ctx, ctx.config).run()


def train_loop(ctx: RankContext, cfg: Any) -> RankOutput:
    return ScalingLoop(ctx, cfg).run()


def run_variants(ctx: RankContext, configs: list[Any]) -> list[dict[str, Any]]:
    """Train several configs one after the other on the same ranks (``labkit.launch``).

    Each variant starts from the same seeded model, so the result equals separate runs; the
    lesson uses it to pay process start-up once instead of once per variant.
    """
    results = []
    for cfg in configs:
        out = train_loop(ctx, cfg)
        results.append({"losses": out.losses, **out.extra, **out.all_metrics(),
                        "params_sha256": out.params_sha256})
    return results
