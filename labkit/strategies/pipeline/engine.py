"""One step of a pipeline plan on one rank: each rank walks its list of actions in order.

What this teaches: a schedule is just an order. Given a ``labkit.schedules.Plan``, rank r
runs ``plan.actions(r)`` one by one; an action ``2F0`` (stage 2, forward, microbatch 0)
receives stage 1's activation, runs stage 2's layers and sends the result on to stage 3; the
matching ``2B0`` receives the gradient from stage 3, backpropagates through stage 2 and sends
the input gradient back to stage 1. GPipe, 1F1B (PipeDream-Flush, Narayanan et al. 2021),
interleaved 1F1B (Megatron-LM) and zero bubble (Qi et al. 2023) differ only in the order.

Why it never deadlocks on gloo: every send is asynchronous (``isend``, waited at the end of
the step), and a rank blocks only in ``recv``, for an input the plan says was produced in an
EARLIER slot. Each message carries a tag naming (kind, stage, microbatch), so a receive
matches its send even when two ranks exchange activations and gradients in different orders
(interleaved plans with two ranks). Every F / B / I / W runs in a traced compute span named
like ``2F0``, and every send / recv in a comm span with the same microbatch and stage.

Zero bubble splits a backward in two, and the split only pays if each half does half the
work. ``I`` asks autograd for the gradients w.r.t. the stage input and w.r.t. the output of
every Linear layer (never the weights, so autograd skips every weight-gradient matmul);
``W`` later turns those into weight gradients, one matmul per layer:
``dW = g^T a`` and ``db = sum(g)``, with ``a`` the layer's input and ``g`` the gradient of its
output. ``I`` and ``W`` each cost about half of ``B``.

The pipeline strategy (``executor``) and the 3D loop (``labkit.strategies.hybrid``) both
run their steps here.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn
from torch.nn import functional as F

from labkit.base.errors import ConfigError
from labkit.base.events import Op as Ev
from labkit.rank.context import RankContext
from labkit.schedules import Op, Plan
from labkit.strategies.pipeline.metrics import StepStat, step_stats


class Stage(Protocol):
    """What the engine needs of a stage module: called on its input, it knows whether it is
    the model's last stage and the shape of the activation it receives and sends, and can
    record every Linear's input and output during a forward (the zero-bubble W pass)."""

    last: bool

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...

    def act_shape(self, rows: int) -> tuple[int, ...]: ...

    def recording_linears(self, on: bool = True
                          ) -> AbstractContextManager[list[tuple[nn.Linear, Any, Any]]]: ...


ACT, GRAD = 0, 1  # message kinds: an activation going forward, a gradient going back

_TRACE_OP = {Op.F: Ev.FORWARD, Op.B: Ev.BACKWARD, Op.I: Ev.BACKWARD_INPUT,
             Op.W: Ev.BACKWARD_WEIGHT}

@dataclass
class StepRecord:
    """What one rank measured in one step."""

    loss: float | None
    stat: StepStat
    peak_activations: int
    messages: int
    bytes_sent: int
    stage_ns: dict[int, int] = field(default_factory=dict)

def tag(kind: int, stage: int, microbatch: int, microbatches: int) -> int:
    """A unique message tag for (kind, sending stage, microbatch)."""
    return 1 + (2 * stage + kind) * microbatches + microbatch

def check_only_linears(mod: nn.Module) -> None:
    """The hand-written W pass knows Linear layers only; refuse anything it would skip."""
    covered = {id(p) for m in mod.modules() if isinstance(m, nn.Linear) for p in m.parameters()}
    other = [n for n, p in mod.named_parameters() if p.requires_grad and id(p) not in covered]
    if other:
        raise ConfigError(f"the zero-bubble W pass computes weight gradients of nn.Linear "
                          f"layers only, but this stage also trains {other}; use schedule "
                          f"'1f1b' for this model")

class _StepRunner:
    """One step of one rank: the plan's actions, their messages and their spans."""

    def __init__(self, ctx: RankContext, plan: Plan, modules: dict[int, Stage],
                 step: int, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
        self.ctx, self.plan, self.modules, self.step = ctx, plan, modules, step
        self.loss_fn = loss_fn
        self.act_shape = next(iter(modules.values())).act_shape
        self.saved: dict[tuple[int, int], list[Any]] = {}
        self.local: dict[tuple[int, int, int], torch.Tensor] = {}
        self.pending: list[Any] = []
        self.spans: list[tuple[int, int]] = []
        self.stage_ns: dict[int, int] = {}
        self._clock: list[tuple[int, Any, Any]] = []  # (stage, start, end) as tracer readings
        self.posted: dict[tuple[int, int, int], tuple[Any, torch.Tensor]] = {}
        self.peak = self.messages = self.bytes = 0
        self.loss = 0.0
        self.cuda = ctx.device.type == "cuda"
        self.comm, self.me = ctx.pp_comm, ctx.pp_rank  # stages talk on the pipeline axis
        self.split = any(a.op is Op.W for a in plan.actions(self.me))

    # ---- messages ------------------------------------------------------------------------
    def _prepost(self, rows: list[int]) -> None:
        """Post every receive this step needs before computing anything.

        A gloo send completes only after the receiver has posted its receive and the
        sender's I/O thread has answered; with every core busy computing, that answer can
        wait milliseconds for a time slice. Posting all receives up front lets that
        handshake happen while the data is not yet needed (PyTorch's pipelining does the
        same). Each message has its own tag, so the order of arrival does not matter.
        """
        for a in self.plan.actions(self.me):
            mod = self.modules[a.stage]
            if a.op is Op.F and a.stage > 0:
                need = (ACT, a.stage - 1)
            elif a.op in (Op.B, Op.I) and not mod.last:
                need = (GRAD, a.stage + 1)
            else:
                continue
            kind, src_stage = need
            src = self.plan.stage_to_rank(src_stage)
            if src == self.me:
                continue
            buf = torch.empty(self.act_shape(rows[a.microbatch]), device=self.ctx.device)
            h = self.comm.irecv(buf, src, tag=tag(kind, src_stage, a.microbatch,
                                                      self.plan.microbatches),
                                    step=self.step, microbatch=a.microbatch, stage=a.stage,
                                    name=str(a))
            self.posted[(kind, src_stage, a.microbatch)] = (h, buf)

    def _get(self, kind: int, src_stage: int, m: int, rows: int, action: Any) -> torch.Tensor:
        src = self.plan.stage_to_rank(src_stage)
        if src == self.me:  # producer and consumer on this rank (P = 1)
            return self.local.pop((kind, src_stage, m))
        if (kind, src_stage, m) in self.posted:
            h, posted_buf = self.posted.pop((kind, src_stage, m))
            h.wait()
            return posted_buf
        buf = torch.empty(self.act_shape(rows), device=self.ctx.device)
        self.comm.recv(buf, src, tag=tag(kind, src_stage, m, self.plan.microbatches),
                           step=self.step, microbatch=m, stage=action.stage, name=str(action))
        return buf

    def _put(self, kind: int, stage: int, m: int, tensor: torch.Tensor, action: Any) -> None:
        dst = self.plan.stage_to_rank(stage + 1 if kind == ACT else stage - 1)
        if dst == self.me:
            self.local[(kind, stage, m)] = tensor
            return
        tensor = tensor.contiguous()
        h = self.comm.isend(tensor, dst, tag=tag(kind, stage, m, self.plan.microbatches),
                                step=self.step, microbatch=m, stage=stage, name=str(action))
        self.pending.append((h, tensor))  # keep the tensor alive until the send completes
        self.messages += 1
        self.bytes += tensor.numel() * tensor.element_size()

    def _poll(self) -> None:
        """Close sends the receiver has taken, so their spans end near when they finished."""
        still = []
        for h, t in self.pending:
            if h.is_completed():
                h.wait()
            else:
                still.append((h, t))
        self.pending = still

    # ---- actions -------------------------------------------------------------------------
    def run(self, xs: list[torch.Tensor], ys: list[torch.Tensor]) -> StepRecord:
        self._prepost([x.shape[0] for x in xs])
        for action in self.plan.actions(self.me):
            self._poll()
            self._action(action, xs, ys)
        for h, _ in self.pending:  # 3. flush: every send has been received
            h.wait()
        self._resolve_spans()
        last = self.plan.num_model_stages - 1
        has_last = last in self.modules
        return StepRecord(self.loss if has_last else None, step_stats(self.spans), self.peak,
                          self.messages, self.bytes, self.stage_ns)

    def _action(self, a: Any, xs: list[torch.Tensor], ys: list[torch.Tensor]) -> None:
        s, m, mod = a.stage, a.microbatch, self.modules[a.stage]
        rows = xs[m].shape[0]
        # 1. receive what this action needs (blocks until the upstream rank sent it)
        inp = grad = None
        if a.op is Op.F and s > 0:
            inp = self._get(ACT, s - 1, m, rows, a).requires_grad_()
        if a.op in (Op.B, Op.I) and not mod.last:
            grad = self._get(GRAD, s + 1, m, rows, a)
        # 2. compute, one span named like "2F0" (on CUDA: events, no synchronize); a
        # blocking collective inside it (tensor parallelism, ZeRO-3) cuts the span
        tracer = self.ctx.tracer
        t0 = tracer.now()
        with tracer.compute(_TRACE_OP[a.op], step=self.step, microbatch=m, stage=s,
                            name=str(a)):
            send = self._compute(a, mod, inp, grad, xs, ys)
        t1 = tracer.now()
        self._clock.append((s, t0, t1))
        # 3. send the result on: activations downstream, input gradients upstream
        if send is not None:
            self._put(ACT if a.op is Op.F else GRAD, s, m, send, a)

    def _resolve_spans(self) -> None:
        """Turn this step's span readings into host ns for the step's statistics. On CUDA the
        readings are events: one synchronize here, at the step boundary, not per action."""
        if self.cuda:
            torch.cuda.synchronize()
        for s, a, b in self._clock:
            t0, t1 = self.ctx.tracer.resolve(a), self.ctx.tracer.resolve(b)
            self.spans.append((t0, t1))
            self.stage_ns[s] = self.stage_ns.get(s, 0) + (t1 - t0)
        self._clock.clear()

    def _compute(self, a: Any, mod: Stage, inp: torch.Tensor | None,
                 grad: torch.Tensor | None, xs: list[torch.Tensor], ys: list[torch.Tensor]
                 ) -> torch.Tensor | None:
        s, m, key = a.stage, a.microbatch, (a.stage, a.microbatch)
        if a.op is Op.F:
            x = xs[m] if s == 0 else inp
            assert x is not None
            if self.split:  # zero bubble's W pass needs every Linear's input and output
                with mod.recording_linears() as linears:
                    out = mod(x)
            else:
                linears, out = [], mod(x)
            if mod.last:  # mean loss of the batch = sum over microbatches of loss_m / M
                out = self.loss_fn(out, ys[m]) / self.plan.microbatches
                self.loss += float(out.detach())
            self.saved[key] = [x, out, linears]
            self.peak = max(self.peak, len(self.saved))
            return None if mod.last else out.detach()
        x, out, linears = self.saved[key]
        if a.op is Op.B:  # input grad and weight grads together
            del self.saved[key]
            torch.autograd.backward(out, grad)
            return x.grad if s > 0 else None
        if a.op is Op.I:  # keep only what W needs: each Linear's input and output grad
            g_in, pending = input_grads(out, x if s > 0 else None, linears, grad)
            self.saved[key] = [None, None, pending]
            return g_in
        weight_grads(self.saved.pop(key)[2])
        return None

Linears = list[tuple[nn.Linear, torch.Tensor, torch.Tensor]]
"""(layer, its input, its output) -- or, after ``input_grads``, (layer, input, output grad)."""

def input_grads(out: torch.Tensor, x: torch.Tensor | None, linears: Linears,
                grad: torch.Tensor | None) -> tuple[torch.Tensor | None, Linears]:
    """Zero bubble's ``I``: the gradient w.r.t. the stage input ``x`` (None for stage 0) and
    w.r.t. every Linear output. No weight is asked for, so autograd runs no weight-gradient
    matmul; returns (input grad, [(layer, layer input, output grad)]) for ``weight_grads``."""
    wanted = ([x] if x is not None else []) + [z for _, _, z in linears]
    grads = list(torch.autograd.grad(out, wanted, grad))
    g_in = grads.pop(0) if x is not None else None
    return g_in, [(lin, a_in.detach(), g) for (lin, a_in, _), g in zip(linears, grads)]

def weight_grads(pending: Linears) -> None:
    """Zero bubble's ``W``: ``dW = g^T a`` and ``db = sum(g)`` per Linear, accumulated into
    ``.grad`` like ``backward()`` would (one matmul per layer, no autograd)."""
    with torch.no_grad():
        for lin, a_in, g in pending:
            for p, dp in ((lin.weight, g.t() @ a_in), (lin.bias, g.sum(0))):
                if p is not None:
                    p.grad = dp if p.grad is None else p.grad.add_(dp)

def run_step(ctx: RankContext, plan: Plan, modules: dict[int, Any], x: torch.Tensor,
             y: torch.Tensor, step: int,
             loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
             ) -> StepRecord:
    """Run this rank's actions of ``plan`` for one batch; gradients accumulate in ``modules``.

    A stage module is called on its input, has ``last`` and ``act_shape(rows)`` (the shape of
    the activation it sends on), e.g. ``Stage`` or ``labkit.train.models.gpt.GPTStage``;
    ``loss_fn(out, y)`` is the last stage's mean loss of one microbatch.
    """
    xs = list(x.tensor_split(plan.microbatches))
    ys = list(y.tensor_split(plan.microbatches))
    return _StepRunner(ctx, plan, modules, step, loss_fn).run(xs, ys)
