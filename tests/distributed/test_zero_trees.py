"""ZeRO on any module tree (issue 25, item 3), on real gloo ranks against one process.

Four toy models a student's code could hold (cs336's test models have the same edge cases):
two layers sharing one weight (*tied*), a frozen bias and a frozen LayerNorm (*frozen*),
parameters held directly by modules that also have children, the model's own included
(*root*), and one layer applied twice (*reused*). Each is sharded by
``labkit.train.parallel.zero.ShardedModel`` at stages 0-3 on 2 ranks, trained 5 AdamW steps
(weight decay on) on each rank's half of a fixed batch, and compared with one process
training the same model on the whole batch: every parameter within 1e-5, a tied weight
the same tensor under both names, a frozen one bit for bit its initial value and without
optimizer state.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import labkit

pytestmark = [pytest.mark.distributed, pytest.mark.lesson05]
STEPS, LR, DECAY, ROWS = 5, 0.05, 0.1, 16


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.out = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 4)
        self.b.weight = self.a.weight  # one Parameter in two layers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.b(torch.tanh(self.a(x)))))


class Frozen(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.norm, self.out = nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4)
        self.inp.bias.requires_grad_(False)
        self.norm.requires_grad_(False)
        with torch.no_grad():
            self.inp.bias.uniform_(-1, 1)
            self.norm.weight.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.norm(self.inp(x))))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((16,), 0.5))  # beside a child
        self.inner = nn.Sequential(nn.Linear(16, 16), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.scale * self.inner(x)


class Root(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(4))  # the model's own, beside its children
        self.inp, self.out = nn.Linear(8, 16), nn.Linear(16, 4)
        self.blocks = nn.Sequential(Block(), nn.Sequential(Block()))  # nested

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.blocks(self.inp(x))) * self.gain


class Reused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f, self.out = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.f(torch.tanh(self.f(x)))))


MODELS = {"tied": Tied, "frozen": Frozen, "root": Root, "reused": Reused}


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    return MODELS[name]()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(ROWS, 8, generator=g), torch.randn(ROWS, 4, generator=g)


def _sharded(ctx: Any, stage: int) -> dict[str, Any]:
    """On each rank: every model sharded at ``stage``, trained on this rank's rows."""
    from labkit.train.parallel.zero import ShardedModel

    out = {}
    x, y = _batch()
    half = ROWS // ctx.world_size
    mine = slice(ctx.rank * half, (ctx.rank + 1) * half)
    for name in MODELS:
        sharded = ShardedModel(_model(name), stage=stage, comm=ctx.comm)
        opt = torch.optim.AdamW(sharded.masters, lr=LR, weight_decay=DECAY)
        for step in range(STEPS):
            sharded.step = step
            loss = nn.functional.mse_loss(sharded(x[mine]), y[mine])
            loss.backward()
            sharded.grads_to_masters(step)
            opt.step()
            sharded.publish(step)
        out[name] = {"state": sharded.full_state(), "optimizer_states": len(opt.state),
                     "trained_units": len(sharded.masters), "units": len(sharded.units)}
    return out


def _reference(name: str) -> tuple[dict[str, torch.Tensor], nn.Module]:
    model = _model(name)
    x, y = _batch()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR,
                            weight_decay=DECAY)
    for _ in range(STEPS):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return {k: v.detach() for k, v in model.state_dict().items()}, model


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_any_module_tree_trains_like_one_process(stage: int, no_leftover_ranks) -> None:
    results = labkit.launch(_sharded, 2, stage, timeout_s=120).results
    for name in MODELS:
        want, model = _reference(name)
        for rank, result in enumerate(results):
            got = result[name]["state"]
            assert sorted(got) == sorted(want), (name, rank, sorted(got), sorted(want))
            for key, value in want.items():
                diff = (got[key] - value).abs().max().item()
                assert diff <= 1e-5, f"stage {stage}, {name}, rank {rank}: {key} off by {diff}"
    tied = results[0]["tied"]["state"]
    assert torch.equal(tied["a.weight"], tied["b.weight"]), "the tied weight came apart"
    frozen, initial = results[0]["frozen"], _model("frozen").state_dict()
    for key in ("inp.bias", "norm.weight", "norm.bias"):
        assert torch.equal(frozen["state"][key], initial[key]), f"frozen {key} moved"
    # 3 trained units (inp.weight, out.weight + out.bias); none for the 3 frozen tensors
    assert frozen["trained_units"] == frozen["optimizer_states"] == 2 and frozen["units"] == 5


def test_the_tied_weight_is_one_shard_not_two() -> None:
    """The tied model's 6 parameter names hold 5 unique tensors (a.weight is b.weight):
    the units hold 5 tensors, the tied one once, named under both names."""
    from labkit.train.parallel.zero import ShardedModel

    class Solo:  # a one-rank comm: ShardedModel only reads its size before a collective
        world_size, rank = 1, 0

    sharded = ShardedModel(_model("tied"), stage=0, comm=Solo())  # type: ignore[arg-type]
    assert sum(len(u.shapes) for u in sharded.units) == 5
    assert sharded.aliases == {"a.weight": ["b.weight"]}
