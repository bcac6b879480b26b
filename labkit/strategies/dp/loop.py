"""The data-parallel training loop both hand-written DDP variants share.

Each rank (1) builds the same seeded model, (2) takes its own shard of the step's global
batch, (3) runs forward and backward on it, (4) lets the ``GradSync`` turn its local
gradients into the average over ranks, and (5) steps its optimizer. Because every rank
starts equal and applies the same averaged gradient, the replicas stay identical, and equal
to one process training on the global batch (``labkit.training.reference_train``).

At ``RECORD_STEP`` the loop also keeps what the "Train Step" visualizer replays: this rank's
loss, the norm of every local gradient before averaging and after, and the update size.
"""

from __future__ import annotations

from typing import Any, Protocol

from torch import nn

from labkit.events import Op
from labkit.rank import RankContext, RankOutput
from labkit.training import (
    BackwardClock,
    build_mlp,
    make_optimizer,
    max_abs_diff,
    params_sha256,
    reference_train,
    task_for,
    traced_backward,
)

RECORD_STEP = 0


class GradSync(Protocol):
    """How gradients are averaged: hooks installed once, then ``finish`` after each backward."""

    def attach(self, ctx: RankContext, params: list[tuple[str, nn.Parameter]]) -> None: ...

    def begin_step(self, step: int) -> None: ...

    def finish(self, step: int) -> None:
        """Block until every ``p.grad`` holds the mean over ranks."""

    def describe(self) -> dict[str, Any]:
        """Metrics about the sync itself (buckets, bytes)."""


def _norms(params: list[tuple[str, nn.Parameter]]) -> list[float]:
    return [float(p.grad.norm()) if p.grad is not None else 0.0 for _, p in params]


def train_data_parallel(ctx: RankContext, sync: GradSync) -> RankOutput:
    cfg = ctx.config
    assert cfg is not None
    model = build_mlp(cfg.model, cfg.seed).to(ctx.device)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    opt = make_optimizer(cfg.optimizer, model.parameters(), cfg.lr)
    clock = BackwardClock(p for _, p in named)
    sync.attach(ctx, named)
    task = task_for(cfg)
    tr = ctx.tracer
    losses: list[float] = []
    record: dict[str, Any] = {}
    for step in range(cfg.steps):
        with ctx.step(step):
            # 1. this rank's shard of the global batch
            x, y = task.batch(step, cfg.batch_size * ctx.world_size, ctx.rank, ctx.world_size)
            x, y = x.to(ctx.device), y.to(ctx.device)
            opt.zero_grad(set_to_none=True)
            sync.begin_step(step)
            # 2. forward and backward on local data only
            with tr.span(Op.FORWARD, step=step):
                loss = nn.functional.cross_entropy(model(x), y)
            traced_backward(ctx, loss, clock, step)
            if step == RECORD_STEP:
                record["grad_norms_local"] = _norms(named)
                before = [p.detach().clone() for _, p in named]
            # 3. average the gradients across ranks
            sync.finish(step)
            if step == RECORD_STEP:
                record["grad_norms_synced"] = _norms(named)
            # 4. identical update on every rank
            with tr.span(Op.OPTIMIZER, step=step):
                opt.step()
            if step == RECORD_STEP:
                record["update_norms"] = [float((p.detach() - b).norm())
                                          for (_, p), b in zip(named, before)]
                record.update(loss=float(loss.item()), step=step, rank=ctx.rank,
                              param_names=[n for n, _ in named],
                              samples=task.indices(step, cfg.batch_size * ctx.world_size)
                              [ctx.rank * cfg.batch_size:(ctx.rank + 1) * cfg.batch_size]
                              .tolist())
            losses.append(float(loss.item()))
    out = RankOutput(losses=losses, extra={"train_step": record})
    out.metrics.update(sync.describe())
    out.metrics["num_params"] = sum(p.numel() for _, p in named)
    if ctx.rank == 0:
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        out.params_sha256 = params_sha256(state.items())
        if cfg.check_reference:
            out.metrics["max_abs_diff_vs_reference"] = max_abs_diff(
                state, reference_train(cfg, ctx.world_size))
    return out


def grad_bytes(params: list[tuple[str, nn.Parameter]]) -> int:
    return sum(p.numel() * p.element_size() for _, p in params)

