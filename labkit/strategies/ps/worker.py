"""A parameter-server worker: the training skeleton with sync = push and a pull before forward.

Per step (``TrainLoop`` hooks):

1. ``begin_step``: pull every server's shard (servers in order), remembering the version of
   each: the gradient computed next belongs to those versions (the first step asks; later
   steps asked with their previous push and only wait for the answer);
2. ``forward_backward``: on this worker's shard of the step's global batch (the same shard a
   DDP rank with this index would get), then, if this worker is the straggler, idle for
   ``(FACTOR - 1)`` x the compute it just did;
3. ``sync``: push each server its slice of the flat gradient, with the version it was
   computed on and the loss (the server measures staleness and logs the loss), asking for
   the next step's weights in the same request;
4. ``update``: nothing; the servers own the optimizer.

After the last step the worker tells every server it is done.
"""

from __future__ import annotations

import time

import torch

from labkit.base.events import Op
from labkit.rank.context import RankOutput, RunContext
from labkit.strategies.ps import workers_of
from labkit.strategies.ps.messages import flat_params, header
from labkit.strategies.ps.protocol import (
    TAG_GRAD,
    TAG_PARAMS,
    TAG_REQUEST,
    Kind,
    parse_straggler,
    shard_bounds,
)
from labkit.strategies.ps.records import PSMetrics
from labkit.train.loop import TrainLoop
from labkit.train.models import build_model


class PSWorker(TrainLoop[PSMetrics]):
    Record = PSMetrics

    def __init__(self, ctx: RunContext):
        model = build_model(ctx.config).to(ctx.device)
        super().__init__(ctx, model)
        opts = self.cfg.options
        self.servers, self.workers = opts.servers, workers_of(self.cfg)
        numel = flat_params(model).numel()
        self.bounds = [shard_bounds(numel, self.servers, s) for s in range(self.servers)]
        self.replies = [torch.empty(1 + hi - lo) for lo, hi in self.bounds]
        self.read_versions = [0] * self.servers
        rank, factor = parse_straggler(opts.straggler) if opts.straggler else (-1, 1.0)
        self.slowdown = factor if rank == ctx.rank else 1.0
        self.pull_wait_ns = 0
        self.last_loss = 0.0
        self.asked = False
        """Whether the last push already asked for the next step's weights."""

    # ---- this worker's place among the workers (servers hold no data) ----------------------
    @property
    def dp(self) -> int:
        return int(self.workers)

    @property
    def dp_rank(self) -> int:
        return self.ctx.rank - self.servers

    # ---- the hooks ---------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        """1. Pull: ask each server, then wait for its answer (held back by BSP / SSP)."""
        comm, t0 = self.ctx.comm, time.monotonic_ns()
        for s, reply in enumerate(self.replies):
            if not self.asked:  # later pulls were asked for by the previous push
                comm.send(header(Kind.PULL, step), s, tag=TAG_REQUEST, name="pull", step=step)
            comm.recv(reply, s, tag=TAG_PARAMS, name="pull", step=step)
            self.read_versions[s] = int(reply[0])
        self.asked = False
        self.pull_wait_ns += time.monotonic_ns() - t0
        weights = torch.cat([r[1:] for r in self.replies])
        torch.nn.utils.vector_to_parameters(weights.to(self.ctx.device), self.params)

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, step: int) -> torch.Tensor:
        """2. Forward and backward; a straggler then idles (FACTOR - 1) x that compute."""
        t0 = time.monotonic_ns()
        loss = super().forward_backward(x, y, step)
        if self.slowdown > 1:
            delay_ns = (self.slowdown - 1) * (time.monotonic_ns() - t0)
            with self.ctx.tracer.span(Op.BACKWARD, step=step, name=f"slow x{self.slowdown:g}"):
                time.sleep(delay_ns / 1e9)
        self.last_loss = float(loss.item())
        return loss

    def sync(self, step: int) -> None:
        """3. Push each server its slice of the gradient, tagged with the version it read."""
        grads = torch.cat([p.grad.reshape(-1) if p.grad is not None else torch.zeros_like(p)
                           .reshape(-1) for p in self.params]).float().cpu()
        comm = self.ctx.comm
        self.asked = step + 1 < self.cfg.steps
        kind = Kind.PUSH_PULL if self.asked else Kind.PUSH
        for s, (lo, hi) in enumerate(self.bounds):
            comm.send(header(kind, step, self.read_versions[s], self.last_loss), s,
                      tag=TAG_REQUEST, name="push", step=step)
            comm.send(grads[lo:hi], s, tag=TAG_GRAD, name="push", step=step)

    def update(self, step: int) -> None:
        """4. Nothing: the servers apply the update."""

    # ---- after training ------------------------------------------------------------------------
    def reports_state(self) -> bool:
        return False  # the weights live on the servers; server 0 hashes them

    def finish(self) -> RankOutput:
        for s in range(self.servers):
            self.ctx.comm.send(header(Kind.DONE, self.cfg.steps), s, tag=TAG_REQUEST,
                               name="done")
        return super().finish()

    def fill_record(self) -> None:
        rec = self.record
        rec.role, rec.worker = "worker", self.dp_rank
        rec.pull_wait_s = self.pull_wait_ns / 1e9
        rec.samples_per_step = rec.flops_per_step = None  # no global step: see updates_per_s
