"""Expert parallelism on real gloo ranks equals the same MoE layer in one process; its
all-to-all bytes equal the prediction from the routing (``labkit.theory.experts``).

Each rank routes its own tokens (a routing group, as in Switch and GShard: capacity is per
group), so the one-process reference runs the layer once per rank's tokens and sums the
losses: its outputs and input gradients are each rank's, its router gradient the sum of the
ranks' (data parallelism would all-reduce it), its expert gradients the ranks' shards side by
side. One launch per world size runs every case (top-1 and top-2, capacity large enough that
nothing drops and small enough that tokens drop), labelled by step.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from labkit.api import launch
from labkit.base.events import Op
from labkit.theory.experts import (
    combine_bytes,
    counts_bytes,
    dispatch_bytes,
    dropped_tokens,
    tokens_between_ranks,
)
from labkit.train.models.moe import MoE
from labkit.train.parallel.experts import COMBINE, COUNTS, DISPATCH, gather_experts

pytestmark = pytest.mark.distributed

TOL = 1e-5
WIDTH, INNER, EXPERTS, TOKENS, AUX = 16, 32, 8, 48, 0.1
CASES = ((1, float(EXPERTS)), (2, float(EXPERTS)), (1, 0.5), (2, 0.5))
"""(top_k, capacity_factor): a factor of ``experts`` gives capacity ``tokens x k``, so no
assignment can drop; 0.5 drops about half."""


def _layer(seed: int, top_k: int, cf: float) -> MoE:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return MoE(WIDTH, INNER, EXPERTS, top_k=top_k, capacity_factor=cf)


def _data(seed: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + 1)
    return (torch.randn(world_size, TOKENS, WIDTH, generator=g),
            torch.randn(world_size, TOKENS, WIDTH, generator=g))


def _ep_cases(ctx: Any) -> list[dict[str, Any]]:
    from labkit.train.parallel.experts import expert_parallel

    out = []
    for step, (top_k, cf) in enumerate(CASES):
        layer = _layer(step, top_k, cf)
        expert_parallel(layer, ctx.comm, step=step)
        xs, ws = _data(step, ctx.world_size)
        x = xs[ctx.rank].clone().requires_grad_()
        y = layer(x)
        ((y * ws[ctx.rank]).sum() + AUX * layer.aux_loss).backward()
        out.append({"out": y.detach(), "x_grad": x.grad, "router": layer.router.weight.grad,
                    "experts": {n: p.grad for n, p in layer.experts.local.named_parameters()},
                    "stats": dataclasses.asdict(layer.stats)})
    return out


def _reference(step: int, top_k: int, cf: float, world_size: int) -> dict[str, Any]:
    """The layer with every expert local, once per rank's tokens, losses summed."""
    layer = _layer(step, top_k, cf)
    xs, ws = _data(step, world_size)
    xs.requires_grad_()
    loss, outs, stats = torch.zeros(()), [], []
    for r in range(world_size):
        y = layer(xs[r])
        loss = loss + (y * ws[r]).sum() + AUX * layer.aux_loss
        outs.append(y.detach())
        stats.append(layer.stats)
    loss.backward()
    assert xs.grad is not None and layer.router.weight.grad is not None
    return {"out": outs, "x_grad": xs.grad, "router": layer.router.weight.grad,
            "experts": {n: p.grad for n, p in layer.experts.named_parameters()}, "stats": stats}


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, f"shapes {tuple(a.shape)} != {tuple(b.shape)}"
    return float((a - b).abs().max()) if a.numel() else 0.0


@pytest.mark.parametrize("world_size", [2, 4])
def test_expert_parallel_equals_one_process_and_its_bytes_the_routing(world_size: int) -> None:
    """Per case: each rank's output and input gradient, the summed router gradient and the
    gathered expert gradients within 1e-5 of one process; dropped assignments per rank equal
    the reference's and ``dropped_tokens``; every all-to-all's traced bytes equal the
    prediction from the reference's routing (payload, the rows a rank keeps included)."""
    res = launch(_ep_cases, world_size, timeout_s=120)
    tl = res.timeline
    for step, (top_k, cf) in enumerate(CASES):
        ref = _reference(step, top_k, cf, world_size)
        got = [r[step] for r in res.results]
        case = f"world {world_size}, top-{top_k}, capacity factor {cf}"
        # 1. forward and backward equal one process
        for r in range(world_size):
            for key, want in (("out", ref["out"][r]), ("x_grad", ref["x_grad"][r])):
                d = _diff(got[r][key], want)
                assert d <= TOL, f"{case}: rank {r} {key} differs by {d:.3g}"
        d = _diff(torch.stack([g["router"] for g in got]).sum(0), ref["router"])
        assert d <= TOL, f"{case}: summed router gradient differs by {d:.3g}"
        for name, t in gather_experts([g["experts"] for g in got]).items():
            d = _diff(t, ref["experts"][name])
            assert d <= TOL, f"{case}: expert gradient {name} differs by {d:.3g}"
        # 2. dropping: the rank's count equals the reference's and the formula's
        drops = []
        for r, s in enumerate(ref["stats"]):
            mine = got[r]["stats"]
            assert mine["tokens_per_expert"] == s.tokens_per_expert, f"{case}: rank {r} routing"
            assert mine["dropped"] == s.dropped == dropped_tokens(s.tokens_per_expert,
                                                                  s.capacity), f"{case}: rank {r}"
            drops.append(s.dropped)
        if cf >= EXPERTS:
            assert sum(drops) == 0, f"{case}: capacity tokens x k dropped {drops}"
        else:
            assert sum(drops) > 0, f"{case}: capacity factor {cf} dropped nothing"
        # 3. bytes of every all-to-all, from the routing
        send = tokens_between_ranks([s.kept_per_expert for s in ref["stats"]], world_size)
        fwd = dispatch_bytes(send, WIDTH, include_self=True)
        back = combine_bytes(send, WIDTH, include_self=True)
        want = {COUNTS: [counts_bytes(EXPERTS)] * world_size, DISPATCH: fwd, COMBINE: back,
                f"{COMBINE}.grad": fwd, f"{DISPATCH}.grad": back}
        for r in range(world_size):
            spans = tl.select(rank=r, op=Op.ALL_TO_ALL, step=step)
            assert {e.axis for e in spans} == {"ep"}, f"{case}: rank {r} axes"
            seen = {e.name: e.bytes for e in spans}
            assert seen == {name: b[r] for name, b in want.items()}, (
                f"{case}: rank {r} traced all-to-all bytes {seen}")
        wire = dispatch_bytes(send, WIDTH)
        assert all(0 < w < f for w, f in zip(wire, fwd)), f"{case}: {wire} vs payload {fwd}"
