"""The lab's one transformer: a small GPT, and its blocks alone.

Radford et al. 2019 (GPT-2) in miniature: token + position embedding, pre-LayerNorm blocks
that compute ``x + Attention(LN(x))`` then ``x + MLP(LN(x))`` with causal softmax attention
over ``heads`` heads and a GELU MLP (4x wide), a final LayerNorm and the head. Sized so a
run takes seconds on two CPU cores (width 128, 4 blocks, 64 tokens: about 0.8 M
parameters). ``build_blocks`` stacks the same blocks without embeddings or head (lesson
04 trains them on activations that stand for earlier layers' output).

The model knows nothing of parallelism, but it is shaped for it the Megatron way (Shoeybi
et al. 2019): in each attention and MLP the first linears (Q, K, V; fc) are the ones a
column split applies to and the last (o; proj) the ones a row split applies to, the
row-side linears carry no bias of their own (``Bias`` adds it once, after the pair), and
each pair sits between two identity modules, ``enter`` and ``exit``, where a transform
places Megatron's f and g operators (``labkit.train.parallel.tensor``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from labkit.train.models.layout import Layout

PARTS = ("both", "attention", "mlp")
"""What a block holds: attention and MLP (a transformer block), or one of them alone."""


class Bias(nn.Module):
    """A bias added on its own (after a row-parallel linear's all-reduce)."""

    def __init__(self, width: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bias


class CausalCore(nn.Module):
    """Causal softmax attention of ``(batch, heads, seq, head_dim)`` q, k, v."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Attention(nn.Module):
    """Causal multi-head self-attention: Q, K, V (column side), then o (row side)."""

    def __init__(self, width: int, heads: int, name: str = ""):
        super().__init__()
        self.heads, self.name = heads, name
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))
        self.o = nn.Linear(width, width, bias=False)
        self.o_bias = Bias(width)
        self.enter: nn.Module = nn.Identity()  # Megatron's f goes here
        self.exit: nn.Module = nn.Identity()  # and g here
        self.core: nn.Module = CausalCore()  # context parallelism puts ring attention here

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.enter(x)  # under sequence parallelism: the slices gathered into the whole
        b, s, _ = x.shape
        q, k, v = (m(x).view(b, s, self.heads, -1).transpose(1, 2)
                   for m in (self.q, self.k, self.v))
        y = self.core(q, k, v)
        y = self.exit(self.o(y.transpose(1, 2).reshape(b, s, -1)))
        return self.o_bias(y)  # type: ignore[no-any-return]


class MLP(nn.Module):
    """Linear(h, inner), GELU, Linear(inner, h): fc (column side), then proj (row side)."""

    def __init__(self, width: int, inner: int, name: str = ""):
        super().__init__()
        self.name = name
        self.fc = nn.Linear(width, inner)
        self.proj = nn.Linear(inner, width, bias=False)
        self.proj_bias = Bias(width)
        self.enter: nn.Module = nn.Identity()  # Megatron's f goes here
        self.exit: nn.Module = nn.Identity()  # and g here

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.exit(self.proj(F.gelu(self.fc(self.enter(x)))))
        return self.proj_bias(y)  # type: ignore[no-any-return]


class Block(nn.Module):
    """``x + Attention(LN(x))`` then ``x + MLP(LN(x))`` (or one of the two, by ``parts``)."""

    def __init__(self, width: int, heads: int, index: int = 0, *, inner: int | None = None,
                 parts: str = "both"):
        super().__init__()
        attn, mlp = parts in ("both", "attention"), parts in ("both", "mlp")
        self.ln1 = nn.LayerNorm(width) if attn else None
        self.ln2 = nn.LayerNorm(width) if mlp else None
        self.attn = Attention(width, heads, f"L{index}.attn") if attn else None
        self.mlp = MLP(width, inner or 4 * width, f"L{index}.mlp") if mlp else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.attn is not None and self.ln1 is not None:
            x = x + self.attn(self.ln1(x))
        if self.mlp is not None and self.ln2 is not None:
            x = x + self.mlp(self.ln2(x))
        return x


class GPT(nn.Module):
    """Decoder-only transformer: embeddings, ``depth`` blocks, final LayerNorm and head."""

    def __init__(self, vocab: int, width: int, depth: int, heads: int, seq_len: int):
        super().__init__()
        self.seq_len, self.width, self.heads = seq_len, width, heads
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(seq_len, width)
        self.blocks = nn.ModuleList(Block(width, heads, i) for i in range(depth))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.sp_scatter: nn.Module = nn.Identity()  # sequence parallelism splits here
        self.sp_gather: nn.Module = nn.Identity()  # and gathers here
        self.seq_split = 1
        """Ranks the sequence between the blocks is split over (1: whole)."""
        self.cp_positions: torch.Tensor | None = None
        """The global positions of the tokens this model runs (None: every position)."""

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        if self.cp_positions is None:
            pos = torch.arange(idx.shape[1], device=idx.device)
        else:  # context parallelism: this rank's tokens only, at their global positions
            pos = self.cp_positions.to(idx.device)
            idx = idx.index_select(1, pos)
        return self.sp_scatter(self.tok(idx) + self.pos(pos))  # type: ignore[no-any-return]

    def unembed(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln_f(self.sp_gather(x)))  # type: ignore[no-any-return]

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.unembed(x)


class Blocks(nn.Sequential):
    """Transformer blocks alone, on activations (b, s, width): lesson 04's model."""

    def __init__(self, width: int, depth: int, heads: int, seq_len: int, inner: int,
                 parts: str):
        super().__init__(*(Block(width, heads, i, inner=inner, parts=parts)
                           for i in range(depth)))
        self.width, self.seq_len, self.heads = width, seq_len, heads


def init_gpt(model: nn.Module, depth: int) -> None:
    """GPT-2's initialisation: N(0, 0.02) weights, zero biases, residual projections scaled
    by 1/sqrt(2 x depth) so the residual stream does not grow with depth."""
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            nn.init.zeros_(p)
        elif p.dim() >= 2:
            std = 0.02 / math.sqrt(2 * depth) if name.endswith(("o.weight", "proj.weight")) else 0.02
            nn.init.normal_(p, 0.0, std)


def _seeded(make: Any, depth: int, seed: int, init: bool = True) -> Any:
    """``make()`` on the CPU with the seed's generator (the caller's RNG state untouched)."""
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    with torch.device("cpu"):
        model = make()
        if init:
            init_gpt(model, depth)
    torch.random.set_rng_state(state)
    return model


def build_gpt(vocab: int, width: int, depth: int, heads: int, seq_len: int, seed: int) -> GPT:
    """The full model, identical on every rank for the same seed (initialised on the CPU)."""
    return _seeded(lambda: GPT(vocab, width, depth, heads, seq_len), depth, seed)  # type: ignore


def build_blocks(width: int, depth: int, heads: int, seq_len: int, inner: int, parts: str,
                 seed: int) -> Blocks:
    """``depth`` blocks of the GPT, seeded like ``build_gpt`` (torch's own initialisation:
    lesson 04 compares a split model with the whole one, whatever the init)."""
    return _seeded(lambda: Blocks(width, depth, heads, seq_len, inner, parts), depth, seed,  # type: ignore
                   init=False)


def gpt_layout(model: GPT) -> Layout:
    """The GPT in the pieces a pipeline cuts between: embedding, blocks, final LN and head."""
    return Layout(blocks=list(model.blocks), prologue=model.embed, epilogue=model.unembed,
                  act_shape=lambda rows: (rows, model.seq_len // model.seq_split, model.width),
                  prologue_modules=[model.tok, model.pos], epilogue_modules=[model.ln_f,
                                                                             model.head])


def blocks_layout(model: Blocks) -> Layout:
    return Layout(blocks=list(model), act_shape=lambda rows: (rows, model.seq_len, model.width))
