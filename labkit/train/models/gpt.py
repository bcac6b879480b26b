"""A small GPT: token + position embedding, pre-LayerNorm blocks, final LayerNorm and head.

Radford et al. 2019 (GPT-2) in miniature: each block computes
``x + Attention(LN(x))`` then ``x + MLP(LN(x))`` with causal softmax attention over
``heads`` heads and a 4x GELU MLP. Sized so a run takes seconds on two CPU cores (width 128,
4 blocks, 64 tokens: about 0.8 M parameters).

Tensor parallelism is built in the Megatron way (Shoeybi et al. 2019): inside a block the
Q, K, V and first MLP linears are *column-parallel* (each rank holds whole heads / a slice of
the 4h columns) and the attention output and second MLP linears are *row-parallel*, with the
operators f (identity forward, all-reduce backward) before each pair and g (all-reduce
forward, identity backward) after it. Row-parallel linears carry no bias of their own: the
bias is a separate ``Bias`` module added once, after g. With ``tp_size = 1`` f and g are
identities and the model is the plain GPT, with the same parameter names, so a
tensor-parallel run is compared weight by weight with one process (``TP_SPLITS``).

Embeddings, LayerNorms and the head are replicated on every tensor-parallel rank: their
inputs are identical there, so their gradients are too, and they need no communication.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from labkit.train.parallel.tensor import f_op, g_op

TP_SPLITS = {"attn.q.weight": 0, "attn.q.bias": 0, "attn.k.weight": 0, "attn.k.bias": 0,
             "attn.v.weight": 0, "attn.v.bias": 0, "attn.o.weight": 1,
             "mlp.fc.weight": 0, "mlp.fc.bias": 0, "mlp.proj.weight": 1}
"""Block parameters tensor parallelism splits, and the dimension it splits (0: output rows of
a column-parallel linear, 1: input columns of a row-parallel one); the rest is replicated."""


def split_dim(name: str) -> int | None:
    """The TP split dimension of a GPT parameter name, or None if it is replicated."""
    for suffix, dim in TP_SPLITS.items():
        if name.endswith(suffix):
            return dim
    return None


class Bias(nn.Module):
    """A bias added on its own (after a row-parallel linear's all-reduce)."""

    def __init__(self, width: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bias


class Attention(nn.Module):
    """Causal multi-head self-attention over ``heads`` heads (this rank's share of them)."""

    def __init__(self, width: int, heads: int, tp_size: int = 1, tp: Any = None, name: str = ""):
        super().__init__()
        local = width // tp_size
        self.heads, self.tp, self.name = heads // tp_size, tp, name
        self.q, self.k, self.v = (nn.Linear(width, local) for _ in range(3))
        self.o = nn.Linear(local, width, bias=False)
        self.o_bias = Bias(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        if self.tp is not None:
            x = f_op(x, self.tp, f"{self.name}.f")
        q, k, v = (m(x).view(b, s, self.heads, -1).transpose(1, 2)
                   for m in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = self.o(y.transpose(1, 2).reshape(b, s, -1))
        if self.tp is not None:
            y = g_op(y, self.tp, f"{self.name}.g")
        return self.o_bias(y)  # type: ignore[no-any-return]


class MLP(nn.Module):
    """Linear(h, 4h), GELU, Linear(4h, h): column- then row-parallel."""

    def __init__(self, width: int, tp_size: int = 1, tp: Any = None, name: str = ""):
        super().__init__()
        inner = 4 * width // tp_size
        self.tp, self.name = tp, name
        self.fc = nn.Linear(width, inner)
        self.proj = nn.Linear(inner, width, bias=False)
        self.proj_bias = Bias(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp is not None:
            x = f_op(x, self.tp, f"{self.name}.f")
        y = self.proj(F.gelu(self.fc(x)))
        if self.tp is not None:
            y = g_op(y, self.tp, f"{self.name}.g")
        return self.proj_bias(y)  # type: ignore[no-any-return]


class Block(nn.Module):
    def __init__(self, width: int, heads: int, tp_size: int = 1, tp: Any = None,
                 index: int = 0):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = Attention(width, heads, tp_size, tp, f"L{index}.attn")
        self.mlp = MLP(width, tp_size, tp, f"L{index}.mlp")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))  # type: ignore[no-any-return]


class GPT(nn.Module):
    """Decoder-only transformer; ``tp_size`` > 1 builds this rank's tensor-parallel shard
    (fill it with ``shard_gpt``)."""

    def __init__(self, vocab: int, width: int, depth: int, heads: int, seq_len: int,
                 tp_size: int = 1, tp: Any = None):
        super().__init__()
        self.seq_len, self.width, self.heads = seq_len, width, heads
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(seq_len, width)
        self.blocks = nn.ModuleList(Block(width, heads, tp_size, tp, i) for i in range(depth))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.tok(idx) + self.pos(pos)  # type: ignore[no-any-return]

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))  # type: ignore[no-any-return]


def init_gpt(model: GPT, depth: int) -> None:
    """GPT-2's initialisation: N(0, 0.02) weights, zero biases, residual projections scaled
    by 1/sqrt(2 x depth) so the residual stream does not grow with depth."""
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            nn.init.zeros_(p)
        elif p.dim() >= 2:
            std = 0.02 / math.sqrt(2 * depth) if name.endswith(("o.weight", "proj.weight")) else 0.02
            nn.init.normal_(p, 0.0, std)


def build_gpt(vocab: int, width: int, depth: int, heads: int, seq_len: int, seed: int) -> GPT:
    """The full model, identical on every rank for the same seed (initialised on the CPU)."""
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    with torch.device("cpu"):
        model = GPT(vocab, width, depth, heads, seq_len)
        init_gpt(model, depth)
    torch.random.set_rng_state(state)
    return model


def shard_gpt(full: GPT, tp_rank: int, tp_size: int, tp: Any) -> GPT:
    """This rank's tensor-parallel GPT: split parameters sliced from ``full``, the rest copied."""
    with torch.device("cpu"):
        local = GPT(full.tok.num_embeddings, full.width, len(full.blocks), full.heads,
                    full.seq_len, tp_size, tp)
    state = {}
    for name, t in full.state_dict().items():
        dim = split_dim(name)
        state[name] = t if dim is None else t.chunk(tp_size, dim=dim)[tp_rank].clone()
    local.load_state_dict(state)
    return local


def unshard(shards: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Every TP rank's state (in TP-rank order) -> the full model's state."""
    out = {}
    for name, t in shards[0].items():
        dim = split_dim(name)
        out[name] = t if dim is None else torch.cat([s[name] for s in shards], dim=dim)
    return out


class GPTStage(nn.Module):
    """Pipeline stage ``stage`` of ``num_stages``: blocks ``bounds[stage]..bounds[stage+1]-1``,
    plus the embeddings on the first stage and the final LayerNorm and head on the last."""

    def __init__(self, gpt: GPT, stage: int, num_stages: int, bounds: Sequence[int]):
        super().__init__()
        self.stage, self.first, self.last = stage, stage == 0, stage == num_stages - 1
        self.lo, self.hi = bounds[stage], bounds[stage + 1]
        self.width, self.seq_len = gpt.width, gpt.seq_len
        self.tok = gpt.tok if self.first else None
        self.pos = gpt.pos if self.first else None
        self.blocks = nn.ModuleList(gpt.blocks[self.lo:self.hi])
        self.ln_f = gpt.ln_f if self.last else None
        self.head = gpt.head if self.last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok is not None and self.pos is not None:
            x = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            x = block(x)
        if self.last:
            assert self.ln_f is not None and self.head is not None
            x = self.head(self.ln_f(x))
        return x

    def act_shape(self, rows: int) -> tuple[int, ...]:
        """The shape of the activation this stage receives / sends for ``rows`` samples."""
        return (rows, self.seq_len, self.width)

    def param_names(self) -> list[str]:
        """This stage's parameter names in the full GPT's state dict (same order)."""
        names = []
        for n, _ in self.named_parameters():
            head, _, rest = n.partition(".")
            if head == "blocks":
                i, _, tail = rest.partition(".")
                names.append(f"blocks.{self.lo + int(i)}.{tail}")
            else:
                names.append(n)
        return names
