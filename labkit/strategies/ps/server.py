"""A parameter server rank: owns one shard of the weights and its optimizer, serves workers.

The loop (one request at a time, in the order they arrive):

1. receive the next request header from any worker (``Comm.recv_any``);
2. PULL: queue it; PUSH: receive the gradient, ask the gate for its staleness, and apply it
   (ASP / SSP: at once, scaled by 1/W so W fresh gradients move the weights as far as one
   synchronous step; BSP: once every worker's gradient of the step is in, their mean);
   PUSH_PULL: both, the pull for the worker's next step; DONE: the worker has finished;
3. answer every queued pull the gate now allows (``Gate.grants``, which also notes each
   read's clock gap), with the version, without blocking (``isend`` of a copy: the server
   goes straight back to serving requests);
4. when every worker is done and nothing is in flight: send the shard to server 0, which
   puts the model together, hashes it and (``--check-reference``) compares it with one
   process trained on the global batch. Under BSP the two must agree to float rounding.

The server has no training steps: its timeline rows hold the requests it waited for
("request"), the gradients it received ("push"), the answers it sent ("pull") and every
update it applied (optimizer spans named by the worker whose gradient it was).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from labkit.base.events import Op
from labkit.rank.context import RankOutput, RunContext, inject_fault
from labkit.strategies.ps import workers_of
from labkit.strategies.ps.messages import flat_params
from labkit.strategies.ps.protocol import (
    TAG_FINAL,
    TAG_GRAD,
    TAG_PARAMS,
    TAG_REQUEST,
    Consistency,
    Gate,
    Kind,
    shard_bounds,
)
from labkit.strategies.ps.records import PSMetrics
from labkit.train.models import build_model
from labkit.train.optim import make_optimizer
from labkit.train.reference import finish_run, reference_run


class ParameterServer:
    def __init__(self, ctx: RunContext):
        self.ctx, self.cfg = ctx, ctx.config
        opts = self.cfg.options
        self.servers, self.workers = opts.servers, workers_of(self.cfg)
        self.model = build_model(self.cfg)
        flat = flat_params(self.model)
        self.numel = flat.numel()
        lo, hi = shard_bounds(self.numel, self.servers, ctx.rank)
        self.shard = torch.nn.Parameter(flat[lo:hi].clone())
        self.optimizer = make_optimizer(self.cfg.optimizer, [self.shard], self.cfg.lr)
        self.gate = Gate(Consistency(opts.consistency), self.workers, opts.bound)
        self.grad = torch.empty(hi - lo)
        self.pending = torch.zeros(hi - lo)  # BSP: sum of this round's gradients
        self.round_losses: list[float] = []
        self.record = PSMetrics(role="server", server=ctx.rank, grad_staleness=[],
                                grad_worker=[], update_t_s=[], update_loss=[])
        self.t0: int | None = None  # when the first request arrived: the clock of loss_vs_time

    # ---- the loop ------------------------------------------------------------------------------
    def serve(self) -> None:
        comm, request = self.ctx.comm, torch.zeros(4, dtype=torch.float64)
        answers: dict[int, tuple[Any, torch.Tensor]] = {}  # worker -> answer in flight
        while not self.gate.all_done:
            for who, (handle, _) in list(answers.items()):
                if handle.is_completed():  # record its span now (gloo sends have no callback)
                    handle.wait()
                    del answers[who]
            self._maybe_fail()
            # 1. the next request, from whichever worker sends first
            src = comm.recv_any(request, tag=TAG_REQUEST, name="request")
            if self.t0 is None:  # time zero: ranks spend seconds importing before training
                self.t0 = time.monotonic_ns()
            kind, step, read_version, loss = request.tolist()
            worker, step = src - self.servers, int(step)
            # 2. what it asks
            if kind == Kind.PULL:
                self.gate.request(worker, step)
            elif kind in (Kind.PUSH, Kind.PUSH_PULL):
                comm.recv(self.grad, src, tag=TAG_GRAD, name="push", step=step)
                self._push(worker, step, int(read_version), loss)
                if kind == Kind.PUSH_PULL:
                    self.gate.request(worker, step + 1)
            elif kind == Kind.DONE:
                self.gate.finished(worker)
            else:
                raise ValueError(f"server {self.ctx.rank} got request kind {kind} from rank {src}")
            # 3. answer every pull the consistency model now allows
            for who, at_step, version in self.gate.grants():
                if who in answers:  # the worker received it before asking again
                    answers.pop(who)[0].wait()
                answer = torch.cat([torch.tensor([float(version)]), self.shard.detach()])
                answers[who] = (comm.isend(answer, self.servers + who, tag=TAG_PARAMS,
                                           name="pull", step=at_step), answer)
        for handle, _ in answers.values():
            handle.wait()

    def _push(self, worker: int, step: int, read_version: int, loss: float) -> None:
        rec = self.record
        assert rec.grad_staleness is not None and rec.grad_worker is not None
        rec.grad_staleness.append(self.gate.pushed(worker, read_version))
        rec.grad_worker.append(worker)
        self.pending += self.grad
        self.round_losses.append(loss)
        if not self.gate.apply_now():
            return  # BSP: wait for the rest of the round
        with self.ctx.tracer.span(Op.OPTIMIZER, step=step, name=f"apply w{worker}"):
            # ASP / SSP: one gradient with weight 1/W; BSP: the mean of all W
            self.shard.grad = self.pending / self.workers
            self.optimizer.step()
        self.gate.applied()
        assert rec.update_t_s is not None and rec.update_loss is not None
        rec.update_t_s.append((time.monotonic_ns() - (self.t0 or 0)) / 1e9)
        rec.update_loss.append(sum(self.round_losses) / len(self.round_losses))
        self.pending.zero_()
        self.round_losses.clear()
        if self.ctx.progress is not None:  # the supervisor's bar counts steps
            per_step = 1 if self.gate.consistency is Consistency.BSP else self.workers
            self.ctx.progress.value = self.gate.version // per_step
        if self.ctx.spool is not None:  # a failed run still shows the server's work
            self.ctx.spool.write()

    def _maybe_fail(self) -> None:
        """``--inject-fault RANK:STEP:KIND`` on a server fires before update STEP."""
        fault = self.ctx.fault
        if fault is not None and fault.rank == self.ctx.rank and fault.step == self.gate.version:
            self.ctx.fault = None
            inject_fault(fault.kind, fault.step)

    # ---- the end -------------------------------------------------------------------------------
    def finish(self) -> RankOutput:
        self.record.clock_gaps = list(self.gate.clock_gaps)
        comm, out = self.ctx.comm, RankOutput(record=self.record)
        if self.ctx.rank != 0:
            comm.send(self.shard.detach(), 0, tag=TAG_FINAL, name="final")
            return out
        # 4. server 0 puts the model together from every shard
        flat = torch.empty(self.numel)
        for s in range(self.servers):
            lo, hi = shard_bounds(self.numel, self.servers, s)
            if s == 0:
                flat[lo:hi] = self.shard.detach()
            else:
                comm.recv(flat[lo:hi], s, tag=TAG_FINAL, name="final")
        torch.nn.utils.vector_to_parameters(flat, self.model.parameters())
        state = {k: v.detach() for k, v in self.model.state_dict().items()}
        self.record.num_params = self.numel
        out.params_sha256 = finish_run(  # the reference: BSP's average over the workers
            state, self.cfg, self.record,
            reference=lambda: reference_run(self.cfg, dp=self.workers).state)
        return out


def serve(ctx: RunContext) -> RankOutput:
    server = ParameterServer(ctx)
    server.serve()
    return server.finish()
