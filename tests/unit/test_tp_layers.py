"""The sharded layers reproduce the full layer when their partial outputs are summed.

One process plays every rank in turn with a comm whose all-reduce does nothing, so each
rank's output before g is its *partial* sum; adding the partials over ranks (what g does on
real ranks) must give the unsharded output. The real all-reduce is tested in
tests/distributed/test_tp.py.
"""

from __future__ import annotations

import pytest
import torch

from labkit.strategies.tp.layers import TPMLP, TPAttention, build_reference
from labkit.train.parallel.tensor import ComputeClock, CopyToTP, ReduceFromTP, TPComm

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


@pytest.mark.parametrize("n", [2, 4])
def test_mlp_partials_sum_to_the_full_mlp(n: int) -> None:
    full = build_reference(64, 256, 8, 1, "mlp", seed=3)[0].mlp
    x = torch.randn(2, 5, 64)
    partials = []
    for r in range(n):
        shard = TPMLP(full, r, n, _tp(n), "L0.mlp")
        partials.append(shard(x) - shard.b2)  # g did nothing: this rank's partial product
    got = sum(partials) + full.fc2.bias
    assert (got - full(x)).abs().max().item() <= 1e-5


@pytest.mark.parametrize("n", [2, 4])
def test_attention_heads_split_partials_sum_to_full_attention(n: int) -> None:
    full = build_reference(64, 256, 8, 1, "attention", seed=4)[0].attn
    x = torch.randn(2, 5, 64)
    got = sum(TPAttention(full, r, n, _tp(n), "L0.attn")(x) - full.o.bias for r in range(n))
    assert (got + full.o.bias - full(x)).abs().max().item() <= 1e-5


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
