"""The unsharded reference model and its Megatron-sharded twin.

Reference (``Layer``): ``x + Attention(x)`` then ``x + MLP(x)`` — no layer norm, so the
comparison isolates the parallel matmuls. Sharded (``TPLayer``), built by slicing the
reference weights so both start identical:

* MLP: ``W1`` (ffn x h) is split by *rows of the weight* = output columns of ``X @ W1^T``
  (column-parallel, bias split too); ``W2`` (h x ffn) by its input columns (row-parallel,
  bias added once after the all-reduce). GELU acts elementwise, so it needs no comm.
* Attention: Q, K, V projections column-parallel by whole heads, so each rank runs softmax
  attention on its own heads; the output projection is row-parallel.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from labkit.train.parallel.tensor import TPComm, f_op, g_op


class MLP(nn.Module):
    def __init__(self, hidden: int, inner: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(hidden, inner), nn.Linear(inner, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(nn.functional.gelu(self.fc1(x)))  # type: ignore[no-any-return]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int) -> torch.Tensor:
    """Softmax attention over ``heads`` heads; inputs and output (b, s, heads * d)."""
    b, s, width = q.shape
    d = width // heads
    q, k, v = (t.view(b, s, heads, d).transpose(1, 2) for t in (q, k, v))
    w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1)
    return (w @ v).transpose(1, 2).reshape(b, s, width)


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
        self.o = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o(attend(self.q(x), self.k(x), self.v(x), self.heads))  # type: ignore


class Layer(nn.Module):
    def __init__(self, hidden: int, inner: int, heads: int, block: str):
        super().__init__()
        self.attn = Attention(hidden, heads) if block in ("both", "attention") else None
        self.mlp = MLP(hidden, inner) if block in ("both", "mlp") else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.attn is not None:
            x = x + self.attn(x)
        if self.mlp is not None:
            x = x + self.mlp(x)
        return x


def build_reference(hidden: int, inner: int, heads: int, layers: int, block: str,
                    seed: int) -> nn.Sequential:
    """The full model, identical on every rank for the same seed."""
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    with torch.device("cpu"):  # CPU init whatever the default device: same weights everywhere
        model = nn.Sequential(*(Layer(hidden, inner, heads, block) for _ in range(layers)))
    torch.random.set_rng_state(state)
    return model


def _rows(w: torch.Tensor, rank: int, n: int) -> nn.Parameter:
    return nn.Parameter(w.detach().chunk(n, dim=0)[rank].clone())


def _cols(w: torch.Tensor, rank: int, n: int) -> nn.Parameter:
    return nn.Parameter(w.detach().chunk(n, dim=-1)[rank].clone())


class TPMLP(nn.Module):
    """Column-parallel fc1, row-parallel fc2: f before, g after."""

    def __init__(self, full: MLP, rank: int, n: int, tp: TPComm, name: str):
        super().__init__()
        self.tp, self.name = tp, name
        self.w1, self.b1 = _rows(full.fc1.weight, rank, n), _rows(full.fc1.bias, rank, n)
        self.w2 = _cols(full.fc2.weight, rank, n)
        self.b2 = nn.Parameter(full.fc2.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = f_op(x, self.tp, f"{self.name}.f")
        partial = nn.functional.gelu(x @ self.w1.T + self.b1) @ self.w2.T
        return g_op(partial, self.tp, f"{self.name}.g") + self.b2


class TPAttention(nn.Module):
    """Heads split across ranks: Q/K/V column-parallel, output projection row-parallel."""

    def __init__(self, full: Attention, rank: int, n: int, tp: TPComm, name: str):
        super().__init__()
        self.tp, self.name, self.heads = tp, name, full.heads // n
        for p in ("q", "k", "v"):
            lin = getattr(full, p)
            setattr(self, f"w{p}", _rows(lin.weight, rank, n))
            setattr(self, f"b{p}", _rows(lin.bias, rank, n))
        self.wo = _cols(full.o.weight, rank, n)
        self.bo = nn.Parameter(full.o.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = f_op(x, self.tp, f"{self.name}.f")
        q, k, v = (x @ getattr(self, f"w{p}").T + getattr(self, f"b{p}") for p in "qkv")
        partial = attend(q, k, v, self.heads) @ self.wo.T
        return g_op(partial, self.tp, f"{self.name}.g") + self.bo


class TPLayer(nn.Module):
    def __init__(self, full: Layer, rank: int, n: int, tp: TPComm, index: int):
        super().__init__()
        self.attn = (TPAttention(full.attn, rank, n, tp, f"L{index}.attn")
                     if full.attn is not None else None)
        self.mlp = TPMLP(full.mlp, rank, n, tp, f"L{index}.mlp") if full.mlp is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.attn is not None:
            x = x + self.attn(x)
        if self.mlp is not None:
            x = x + self.mlp(x)
        return x


# How each sharded parameter maps back to the reference: (reference name, split dim or None).
def shard_map(block: str) -> dict[str, tuple[str, int | None]]:
    out: dict[str, tuple[str, int | None]] = {}
    if block in ("both", "attention"):
        for p in "qkv":
            out[f"attn.w{p}"] = (f"attn.{p}.weight", 0)
            out[f"attn.b{p}"] = (f"attn.{p}.bias", 0)
        out["attn.wo"], out["attn.bo"] = ("attn.o.weight", 1), ("attn.o.bias", None)
    if block in ("both", "mlp"):
        out["mlp.w1"], out["mlp.b1"] = ("mlp.fc1.weight", 0), ("mlp.fc1.bias", 0)
        out["mlp.w2"], out["mlp.b2"] = ("mlp.fc2.weight", 1), ("mlp.fc2.bias", None)
    return out
