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

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

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


# ---- the transform: Megatron's split of every attention and MLP in a model ----------------

TP_SPLITS = {"attn.q.weight": 0, "attn.q.bias": 0, "attn.k.weight": 0, "attn.k.bias": 0,
             "attn.v.weight": 0, "attn.v.bias": 0, "attn.o.weight": 1,
             "mlp.fc.weight": 0, "mlp.fc.bias": 0, "mlp.proj.weight": 1}
"""Block parameters tensor parallelism splits, and the dimension it splits (0: output rows of
a column-parallel linear, 1: input columns of a row-parallel one); the rest is replicated."""


def split_dim(name: str) -> int | None:
    """The split dimension of a transformer parameter name, or None if it is replicated."""
    for suffix, dim in TP_SPLITS.items():
        if name.endswith(suffix):
            return dim
    return None


class EnterTP(nn.Module):
    """Megatron's f as a module: where a column-parallel linear's input enters the split."""

    def __init__(self, tp: TPComm, name: str):
        super().__init__()
        self.tp, self.name = tp, name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return f_op(x, self.tp, self.name)


class ExitTP(nn.Module):
    """Megatron's g as a module: where a row-parallel linear's partial sums are added up."""

    def __init__(self, tp: TPComm, name: str):
        super().__init__()
        self.tp, self.name = tp, name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return g_op(x, self.tp, self.name)


def _keep(lin: nn.Linear, dim: int, rank: int, size: int) -> None:
    """Keep this rank's slice of ``lin`` along ``dim`` (0: output rows, with the bias;
    1: input columns)."""
    lin.weight = nn.Parameter(lin.weight.detach().chunk(size, dim=dim)[rank].clone())
    if dim == 0 and lin.bias is not None:
        lin.bias = nn.Parameter(lin.bias.detach().chunk(size, dim=0)[rank].clone())
    lin.out_features, lin.in_features = lin.weight.shape


def tensor_parallel(model: nn.Module, tp_rank: int, tp_size: int, tp: TPComm | None
                    ) -> nn.Module:
    """Split every attention and MLP of ``model`` in place, the Megatron way.

    1. column side: Q, K and V keep this rank's whole heads, fc its share of the inner
       columns (weights by output rows, biases with them);
    2. row side: o and proj keep the matching input columns (their biases are separate
       ``Bias`` modules, replicated and added once after g);
    3. f before each pair and g after it (``EnterTP`` / ``ExitTP``) on the tensor-parallel
       comm ``tp`` (None: no communication, e.g. to inspect one rank's slices).

    Embeddings, LayerNorms and the head stay whole on every rank: their inputs are the
    same there, so their gradients are too. Sequence parallelism is applied on top of this
    (``labkit.train.parallel.sequence.sequence_parallel``: the LayerNorm regions then work
    on 1/t of the sequence and f/g become an all-gather and a reduce-scatter). Returns
    ``model``.
    """
    from labkit.train.models.gpt import MLP, Attention

    for mod in list(model.modules()):
        if isinstance(mod, Attention):
            for lin in (mod.q, mod.k, mod.v):
                _keep(lin, 0, tp_rank, tp_size)
            _keep(mod.o, 1, tp_rank, tp_size)
            mod.heads //= tp_size
        elif isinstance(mod, MLP):
            _keep(mod.fc, 0, tp_rank, tp_size)
            _keep(mod.proj, 1, tp_rank, tp_size)
        else:
            continue
        if tp is not None:
            mod.enter, mod.exit = EnterTP(tp, f"{mod.name}.f"), ExitTP(tp, f"{mod.name}.g")
    return model


def gather_slices(comm: Any, t: torch.Tensor, dim: int) -> torch.Tensor:
    """The whole tensor from every tensor-parallel rank's slice along ``dim`` (a collective)."""
    src = (t if dim == 0 else t.transpose(0, dim)).contiguous()
    out = torch.empty((src.shape[0] * comm.world_size, *src.shape[1:]), dtype=src.dtype,
                      device=src.device)
    comm.all_gather(out, src, name="gather")
    return out if dim == 0 else out.transpose(0, dim).contiguous()


def gather_state(state: dict[str, torch.Tensor], comm: Any) -> dict[str, torch.Tensor]:
    """A tensor-parallel rank's state made whole: every split tensor all-gathered on
    ``comm`` (every tensor-parallel rank calls it, in the same order)."""
    out = {}
    for name, t in state.items():
        dim = split_dim(name)
        out[name] = t if dim is None or comm.world_size == 1 else gather_slices(comm, t, dim)
    return out


def unshard(shards: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Every tensor-parallel rank's state (in rank order) -> the whole model's state."""
    out = {}
    for name, t in shards[0].items():
        dim = split_dim(name)
        out[name] = t if dim is None else torch.cat([s[name] for s in shards], dim=dim)
    return out
