"""The data-parallel loop both hand-written DDP variants share: ``TrainLoop`` + a ``GradSync``.

Each rank (1) builds the same seeded model, (2) takes its own shard of the step's global
batch, (3) runs forward and backward on it, (4) lets the ``GradSync`` turn its local
gradients into the average over ranks, and (5) steps its optimizer. Because every rank
starts equal and applies the same averaged gradient, the replicas stay identical, and equal
to one process training on the global batch (``labkit.train.reference.reference_run``).

At its last step the loop also keeps what the "Train Step" visualizer replays: this rank's
loss, the norm of every local gradient before averaging and after, the update size, and the
hash of this replica's parameters after the update (equal on every rank: the proof that the
replicas are in sync again).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn

from labkit.rank.context import RankOutput, RunContext
from labkit.strategies.dp import DPMetrics
from labkit.train.loop import TrainLoop
from labkit.train.models import build_model
from labkit.train.reference import params_sha256


class GradSync(Protocol):
    """How gradients are averaged: hooks installed once, then ``finish`` after each backward."""

    def attach(self, ctx: RunContext, params: list[tuple[str, nn.Parameter]]) -> None: ...

    def begin_step(self, step: int) -> None: ...

    def finish(self, step: int) -> None:
        """Block until every ``p.grad`` holds the mean over ranks."""

    def describe(self) -> dict[str, Any]:
        """Metrics about the sync itself (``DPMetrics`` fields: buckets, bytes)."""


def _norms(params: list[tuple[str, nn.Parameter]]) -> list[float]:
    return [float(p.grad.norm()) if p.grad is not None else 0.0 for _, p in params]


class DataParallelLoop(TrainLoop[DPMetrics]):
    Record = DPMetrics

    def __init__(self, ctx: RunContext, grad_sync: GradSync):
        model = build_model(ctx.config).to(ctx.device)
        super().__init__(ctx, model)
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.grad_sync = grad_sync
        grad_sync.attach(ctx, self.named)
        self.train_record: dict[str, Any] = {}
        self._before: list[torch.Tensor] = []
        self.record_step = self.cfg.steps - 1
        """The step the "Train Step" visualizer replays: the last one."""

    def begin_step(self, step: int) -> None:
        self.grad_sync.begin_step(step)

    def sync(self, step: int) -> None:
        if step == self.record_step:
            self.train_record["grad_norms_local"] = _norms(self.named)
            self._before = [p.detach().clone() for _, p in self.named]
        self.grad_sync.finish(step)
        if step == self.record_step:
            self.train_record["grad_norms_synced"] = _norms(self.named)

    def update(self, step: int) -> None:
        super().update(step)
        if step == self.record_step:
            ctx, b = self.ctx, self.cfg.batch_size
            self.train_record["update_norms"] = [float((p.detach() - w).norm())
                                                 for (_, p), w in zip(self.named, self._before)]
            self.train_record.update(
                step=step, rank=ctx.rank, param_names=[n for n, _ in self.named],
                params_sha256=params_sha256(self.named),
                samples=self.task.indices(step, self.global_batch())
                [ctx.rank * b:(ctx.rank + 1) * b].tolist())

    def train_step(self, step: int) -> None:
        super().train_step(step)
        if step == self.record_step:
            self.train_record["loss"] = self.losses[-1]

    def fill_record(self) -> None:
        for key, value in self.grad_sync.describe().items():
            setattr(self.record, key, value)

    def finish(self) -> RankOutput:
        out = super().finish()
        out.extra["train_step"] = self.train_record
        return out


def train_data_parallel(ctx: RunContext, grad_sync: GradSync) -> RankOutput:
    return DataParallelLoop(ctx, grad_sync).run()


def grad_bytes(params: list[tuple[str, nn.Parameter]]) -> int:
    return sum(p.numel() * p.element_size() for _, p in params)
