"""Megatron's two communication operators, *f* and *g*, as autograd functions.

Shoeybi et al. 2019 (Megatron-LM, figure 3) put two conjugate operators around every
column-parallel / row-parallel pair of linears:

* **f** sits *before* the column-parallel linear. Forward: identity (every rank already holds
  the whole input X). Backward: all-reduce (sum) the gradient w.r.t. X, because each rank
  only computed the part of dL/dX that flows through its own columns.
* **g** sits *after* the row-parallel linear. Forward: all-reduce (sum) the partial outputs,
  because each rank multiplied only its slice of the inner dimension. Backward: identity
  (the gradient of a sum w.r.t. each term is the gradient of the sum itself).

Both talk through ``ctx.comm`` (the traced comm layer), so every all-reduce is a span with
its bytes. ``ComputeClock`` cuts the compute lane at each all-reduce: the timeline then shows
compute and communication as the disjoint, sequential pieces they really are (nothing hides).
"""

from __future__ import annotations

from typing import Any

import torch

from labkit.events import Op


class ComputeClock:
    """Records compute spans between communication calls (forward or backward)."""

    def __init__(self, tracer: Any):
        self.tracer = tracer
        self.op: Op | None = None
        self.step: int | None = None
        self._start = 0

    def begin(self, op: Op, step: int) -> None:
        self.op, self.step, self._start = op, step, self.tracer.now()

    def pause(self) -> None:
        if self.op is not None:
            self.tracer.record(self.op, self._start, self.tracer.now(), step=self.step)

    def resume(self) -> None:
        self._start = self.tracer.now()

    def end(self) -> None:
        self.pause()
        self.op = None


class TPComm:
    """What f and g need: the traced comm, the clock, the current step."""

    def __init__(self, comm: Any, clock: ComputeClock):
        self.comm, self.clock, self.step = comm, clock, 0

    def all_reduce(self, t: torch.Tensor, name: str) -> torch.Tensor:
        self.clock.pause()
        self.comm.all_reduce(t, step=self.step, name=name)
        self.clock.resume()
        return t


class CopyToTP(torch.autograd.Function):
    """Megatron's f. Forward: identity. Backward: all-reduce (sum) the input gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TPComm, name: str) -> torch.Tensor:
        ctx.tp, ctx.name = tp, name
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        if ctx.tp.comm.world_size == 1:
            return grad, None, None
        return ctx.tp.all_reduce(grad.contiguous().clone(), ctx.name), None, None


class ReduceFromTP(torch.autograd.Function):
    """Megatron's g. Forward: all-reduce (sum) the partial outputs. Backward: identity."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TPComm, name: str) -> torch.Tensor:
        if tp.comm.world_size == 1:
            return x.view_as(x)
        return tp.all_reduce(x.contiguous().clone(), name)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return grad, None, None


def f_op(x: torch.Tensor, tp: TPComm, name: str) -> torch.Tensor:
    """Megatron f (identity forward, all-reduce backward)."""
    return CopyToTP.apply(x, tp, name)  # type: ignore[no-any-return]


def g_op(x: torch.Tensor, tp: TPComm, name: str) -> torch.Tensor:
    """Megatron g (all-reduce forward, identity backward)."""
    return ReduceFromTP.apply(x, tp, name)  # type: ignore[no-any-return]
