"""Sequence parallelism: the regions tensor parallelism leaves whole, split along the sequence.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
section 4.2.2, figure 5): under Megatron's tensor parallelism every rank of a TP group holds
the *whole* activation (b, s, h) outside the column/row pairs -- the LayerNorms, the bias
adds, the residual stream, the dropouts -- and computes the same thing there t times. Those
ops work token by token, so each rank can keep 1/t of the sequence instead:

* **f-bar** (before the column-parallel linears) replaces f: forward, all-gather the
  sequence slices into the whole (b, s, h); backward, reduce-scatter the input gradient
  (sum the partial gradients and keep this rank's slice of the sum).
* **g-bar** (after the row-parallel linear) replaces g: forward, reduce-scatter the partial
  outputs (sum, keep this rank's slice); backward, all-gather the gradient.

A ring all-reduce *is* a reduce-scatter followed by an all-gather, so each pair sends what
TP's all-reduce sent: per rank ``(t-1)/t x B`` for the all-gather plus ``(t-1)/t x B`` for
the reduce-scatter, ``2 (t-1)/t x B`` in all, where B is the bytes of one (b, s, h)
activation. The memory of the LayerNorm regions is divided by t for free.

Two more operators sit where the sequence enters and leaves the split: ``ScatterToSP``
after the embedding (forward: keep the slice; backward: all-gather the gradient) and
``GatherFromSP`` before the final LayerNorm (forward: all-gather; backward: keep the slice,
since every rank computes the same loss from the whole sequence). The parameters of the split
regions (the blocks' LayerNorms and the two output biases) now see only a slice of the tokens,
so each rank's gradient of them is partial: ``SPParam`` all-reduces it on the TP group, per
microbatch, in the backward (Megatron sums them once per step instead; the sum is the same).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from labkit.train.parallel.tensor import TPComm, f_op


def _slice(x: torch.Tensor, tp: TPComm) -> torch.Tensor:
    """This TP rank's 1/t of ``x`` along the sequence (dim 1)."""
    return x.chunk(tp.comm.world_size, dim=1)[tp.comm.rank].contiguous()


def _gather(x: torch.Tensor, tp: TPComm, name: str) -> torch.Tensor:
    """Every TP rank's sequence slice, concatenated along dim 1 (an all-gather)."""
    t = tp.comm.world_size
    src = x.transpose(0, 1).contiguous()                 # (s/t, b, h): gather along dim 0
    out = torch.empty((src.shape[0] * t, *src.shape[1:]), dtype=src.dtype, device=src.device)
    tp.comm.all_gather(out, src, step=tp.step, name=name)
    return out.transpose(0, 1).contiguous()


def _reduce_scatter(x: torch.Tensor, tp: TPComm, name: str) -> torch.Tensor:
    """The sum of every TP rank's ``x``, this rank keeping its slice of the sequence."""
    t = tp.comm.world_size
    src = x.transpose(0, 1).contiguous()                 # (s, b, h): scatter along dim 0
    out = torch.empty((src.shape[0] // t, *src.shape[1:]), dtype=src.dtype, device=src.device)
    tp.comm.reduce_scatter(out, src, step=tp.step, name=name)
    return out.transpose(0, 1).contiguous()


class _SPOp(torch.autograd.Function):
    """One of the four operators, by ``kind``: forward and backward as the module says."""

    FORWARD = {"enter": "gather", "exit": "reduce_scatter", "scatter": "slice",
               "gather": "gather"}
    BACKWARD = {"enter": "reduce_scatter", "exit": "gather", "scatter": "gather",
                "gather": "slice"}

    @staticmethod
    def _do(what: str, x: torch.Tensor, tp: TPComm, name: str) -> torch.Tensor:
        if what == "slice":
            return _slice(x, tp)
        if what == "gather":
            return _gather(x, tp, name)
        return _reduce_scatter(x, tp, name)

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TPComm, name: str, kind: str) -> torch.Tensor:
        ctx.tp, ctx.name, ctx.kind = tp, name, kind
        return _SPOp._do(_SPOp.FORWARD[kind], x, tp, name)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return _SPOp._do(_SPOp.BACKWARD[ctx.kind], grad, ctx.tp, ctx.name), None, None, None


class SPOp(nn.Module):
    """f-bar (``enter``), g-bar (``exit``), ``scatter`` into or ``gather`` out of the split."""

    def __init__(self, tp: TPComm, name: str, kind: str):
        super().__init__()
        if kind not in _SPOp.FORWARD:
            raise ValueError(f"kind ({kind!r}) must be one of {', '.join(_SPOp.FORWARD)}")
        self.tp, self.name, self.kind = tp, name, kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.comm.world_size == 1:
            return x
        return _SPOp.apply(x, self.tp, self.name, self.kind)  # type: ignore[no-any-return]


class SPLayerNorm(nn.LayerNorm):
    """A LayerNorm on a sequence slice: its weight and bias pass through Megatron's f
    (identity forward, all-reduce of the partial gradient backward)."""

    tp: TPComm
    sp_name: str

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = f_op(self.weight, self.tp, self.sp_name + ".w")
        return F.layer_norm(x, self.normalized_shape, w,
                            f_op(self.bias, self.tp, self.sp_name + ".b"), self.eps)


class SPParam(nn.Module):
    """``Bias`` on a sequence slice: the bias passes through f (its gradient all-reduced)."""

    def __init__(self, bias: nn.Parameter, tp: TPComm, name: str):
        super().__init__()
        self.bias, self.tp, self.name = bias, tp, name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + f_op(self.bias, self.tp, self.name)


def _sp_layer_norm(ln: nn.LayerNorm, tp: TPComm, name: str) -> SPLayerNorm:
    """``ln`` as an ``SPLayerNorm`` holding the same Parameter objects."""
    new = SPLayerNorm(ln.normalized_shape, eps=ln.eps)
    new.weight, new.bias = ln.weight, ln.bias
    new.tp, new.sp_name = tp, name
    return new


def sequence_parallel(model: nn.Module, tp: TPComm) -> nn.Module:
    """Turn a ``tensor_parallel`` GPT's TP regions sequence-parallel, in place: f and g
    become f-bar and g-bar, the blocks' LayerNorms and output biases sum their gradients on
    the TP group, and the model scatters the sequence after its embedding and gathers it
    before its final LayerNorm. Returns ``model``."""
    from labkit.train.models.gpt import GPT, MLP, Attention, Block

    if not isinstance(model, GPT):
        raise TypeError(f"sequence parallelism splits the GPT's sequence, not a "
                        f"{type(model).__name__}'s")
    for mod in list(model.modules()):
        if isinstance(mod, (Attention, MLP)):
            mod.enter, mod.exit = SPOp(tp, f"{mod.name}.f", "enter"), \
                SPOp(tp, f"{mod.name}.g", "exit")
            bias = mod.o_bias if isinstance(mod, Attention) else mod.proj_bias
            sp_bias = SPParam(bias.bias, tp, f"{mod.name}.bias")
            if isinstance(mod, Attention):
                mod.o_bias = sp_bias  # type: ignore[assignment]
            else:
                mod.proj_bias = sp_bias  # type: ignore[assignment]
        elif isinstance(mod, Block):
            where = (mod.attn or mod.mlp).name.split(".")[0]  # type: ignore[union-attr]
            for part in ("ln1", "ln2"):
                ln = getattr(mod, part)
                if ln is not None:
                    setattr(mod, part, _sp_layer_norm(ln, tp, f"{where}.{part}"))
    model.sp_scatter = SPOp(tp, "sp.scatter", "scatter")
    model.sp_gather = SPOp(tp, "sp.gather", "gather")
    model.seq_split = tp.comm.world_size
    return model
