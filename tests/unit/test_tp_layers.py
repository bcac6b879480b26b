"""The tensor-parallel split of the transformer's attention and MLP reproduces the whole
module when the partial outputs are summed.

One process plays every rank in turn with a comm whose all-reduce does nothing, so each
rank's output before g is its *partial* sum; adding the partials over ranks (what g does on
real ranks) must give the unsharded output. The real all-reduce is tested in
tests/distributed/test_tp.py.
"""

from __future__ import annotations

import copy

import pytest
import torch

from labkit.train.models import build_blocks
from labkit.train.parallel.tensor import (
    ComputeClock,
    CopyToTP,
    ReduceFromTP,
    TPComm,
    tensor_parallel,
)

pytestmark = pytest.mark.lesson04


class NullComm:
    def __init__(self, world_size: int):
        self.world_size = world_size
        self.calls: list[str] = []

    def all_reduce(self, t: torch.Tensor, **meta: object) -> None:
        self.calls.append(str(meta.get("name")))


class NullTracer:
    def now(self) -> int:
        return 0

    def record(self, *a: object, **k: object) -> None:
        pass


def _tp(n: int) -> TPComm:
    return TPComm(NullComm(n), ComputeClock(NullTracer()))


def _split(module: torch.nn.Module, rank: int, n: int) -> torch.nn.Module:
    return tensor_parallel(copy.deepcopy(module), rank, n, _tp(n))


@pytest.mark.parametrize("n", [2, 4])
def test_mlp_partials_sum_to_the_full_mlp(n: int) -> None:
    """Column-parallel fc, row-parallel proj: each rank's output before g's all-reduce is a
    partial sum; the partials add up to the whole MLP (its bias added once)."""
    full = build_blocks(64, 1, 8, 5, 256, "mlp", seed=3)[0].mlp
    x = torch.randn(2, 5, 64)
    bias = full.proj_bias.bias
    got = sum(_split(full, r, n)(x) - bias for r in range(n)) + bias
    assert (got - full(x)).abs().max().item() <= 1e-5


@pytest.mark.parametrize("n", [2, 4])
def test_attention_heads_split_partials_sum_to_full_attention(n: int) -> None:
    """Whole heads per rank: Q, K, V by output rows, o by input columns."""
    full = build_blocks(64, 1, 8, 5, 256, "attention", seed=4)[0].attn
    x = torch.randn(2, 5, 64)
    bias = full.o_bias.bias
    parts = [_split(full, r, n) for r in range(n)]
    assert all(p.heads == 8 // n and p.q.weight.shape == (64 // n, 64) for p in parts)
    got = sum(p(x) - bias for p in parts) + bias
    assert (got - full(x)).abs().max().item() <= 1e-5


def test_the_split_is_megatrons_and_f_g_sit_around_each_pair() -> None:
    """Every split parameter is sliced on the dimension ``TP_SPLITS`` names; the whole
    model's own modules are untouched; f and g are installed with the block's names."""
    from labkit.train.parallel.tensor import EnterTP, ExitTP, split_dim

    full = build_blocks(32, 2, 4, 3, 128, "both", seed=0)
    part = _split(full, 1, 2)
    for (name, whole), (_, mine) in zip(full.named_parameters(), part.named_parameters()):
        dim = split_dim(name)
        expected = whole if dim is None else whole.chunk(2, dim=dim)[1]
        assert torch.equal(mine, expected), name
    attn, mlp = part[1].attn, part[1].mlp
    assert isinstance(attn.enter, EnterTP) and attn.enter.name == "L1.attn.f"
    assert isinstance(mlp.exit, ExitTP) and mlp.exit.name == "L1.mlp.g"
    assert isinstance(full[1].attn.enter, torch.nn.Identity)


def test_f_all_reduces_only_in_backward_and_g_only_in_forward() -> None:
    """The conjugate pair: f is identity forward, g is identity backward."""
    tp = _tp(2)
    x = torch.randn(3, 4, requires_grad=True)
    y = CopyToTP.apply(x, tp, "f")
    assert tp.comm.calls == []
    z = ReduceFromTP.apply(y * 2, tp, "g")
    assert tp.comm.calls == ["g"]
    z.sum().backward()
    assert tp.comm.calls == ["g", "f"]
    assert torch.equal(x.grad, torch.full((3, 4), 2.0))
