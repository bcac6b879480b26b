"""Megatron's two communication operators, *f* and *g*, as autograd functions.

Shoeybi et al. 2019 (Megatron-LM, figure 3) put two conjugate operators around every
column-parallel / row-parallel pair of linears:

* **f** sits *before* the column-parallel linear. Forward: identity (every rank already holds
  the whole input X). Backward: all-reduce (sum) the gradient w.r.t. X, because each rank
  only computed the part of dL/dX that flows through its own columns.
* **g** sits *after* the row-parallel linear. Forward: all-reduce (sum) the partial outputs,
  because each rank multiplied only its slice of the inner dimension. Backward: identity
  (the gradient of a sum w.r.t. each term is the gradient of the sum itself).

Both talk through the tensor-parallel ``Comm`` (the traced comm layer), so every all-reduce
is a span with its bytes, and a blocking all-reduce cuts the compute span around it
(``Tracer.compute``): the timeline shows compute and communication as the disjoint,
sequential pieces they really are (nothing hides).
"""

from __future__ import annotations

from typing import Any

import torch

from labkit.base.events import Op


class ComputeClock:
    """A forward or backward pass as one compute span (``Tracer.compute``) that every
    blocking all-reduce inside it cuts: ``begin(Op.FORWARD, step)`` ... ``end()``."""

    def __init__(self, tracer: Any):
        self.tracer = tracer
        self._span: Any = None

    def begin(self, op: Op, step: int) -> None:
        self._span = self.tracer.compute(op, step=step)
        self._span.__enter__()

    def end(self) -> None:
        if self._span is not None:
            self._span.__exit__(None, None, None)
            self._span = None


class TPComm:
    """What f and g need: the tensor-parallel comm and the current step (the comm layer
    cuts the open compute span while an all-reduce blocks)."""

    def __init__(self, comm: Any, clock: ComputeClock | None = None):
        self.comm, self.clock, self.step = comm, clock, 0

    def all_reduce(self, t: torch.Tensor, name: str) -> torch.Tensor:
        self.comm.all_reduce(t, step=self.step, name=name)
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
