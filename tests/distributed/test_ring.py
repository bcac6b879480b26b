"""The hand-written ring all-reduce equals the backend's all-reduce, and sends 2(n-1)/n x size.

Real gloo ranks. One launch per world size checks several sizes (including sizes not
divisible by the world size and smaller than it) and the two naive schemes.
"""

from __future__ import annotations

from typing import Any

import pytest

from labkit.api import launch
from labkit.base.events import Op
from labkit.strategies.collectives.ring import ALGORITHMS, record_ring

pytestmark = [pytest.mark.distributed, pytest.mark.lesson01]

NUMELS = (1, 5, 7, 1000, 1001)  # 4-byte floats; 1 and 5 leave some chunks empty or uneven


def _compare_all(ctx: Any) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"rank": ctx.rank, "diffs": {}, "scales": {}}
    for numel in NUMELS:
        g = torch.Generator().manual_seed(numel * 10 + ctx.rank)
        x = torch.randn(numel, generator=g)
        expected = x.clone()
        ctx.comm.all_reduce(expected, step=numel, name="builtin")
        for algo, fn in ALGORITHMS.items():
            got = fn(ctx.comm, x.clone(), step=numel)
            out["diffs"][f"{algo}/{numel}"] = float((got - expected).abs().max())
        out["scales"][numel] = float(expected.abs().max())
    return out


def _check(world_size: int) -> None:
    res = launch(_compare_all, world_size, timeout_s=90)
    for r in res.results:
        for key, diff in r["diffs"].items():
            numel = int(key.split("/")[1])
            tol = 1e-6 * max(1.0, r["scales"][numel])
            assert diff <= tol, (f"rank {r['rank']}: {key} differs from dist.all_reduce by "
                                 f"{diff:.3g} (> {tol:.3g}) at world_size {world_size}")
    tl = res.timeline
    n = world_size
    for numel in NUMELS:
        size = numel * 4
        sends = {r: [e for e in tl.select(rank=r, op=Op.SEND, step=numel)
                     if e.name and e.name[:2] in ("RS", "AG")] for r in range(n)}
        per_rank = [sum(e.bytes or 0 for e in sends[r]) for r in range(n)]
        # total over ranks is exact for every size: 2(n-1) chunks of every chunk
        assert sum(per_rank) == 2 * (n - 1) * size, (numel, per_rank)
        if numel % n == 0:
            assert all(b == 2 * (n - 1) * size // n for b in per_rank), (numel, per_rank)
        for r in range(n):
            for e in sends[r]:
                assert e.peer == (r + 1) % n, f"rank {r} sent {e.name} to {e.peer}, not right"
                assert e.chunk is not None
        naive_root = sum(e.bytes or 0 for e in tl.select(rank=0, op=Op.SEND, step=numel)
                         if e.name == "from-root")
        assert naive_root == (n - 1) * size
        a2a = [sum(e.bytes or 0 for e in tl.select(rank=r, op=Op.SEND, step=numel)
                   if e.name == "all-to-all") for r in range(n)]
        assert a2a == [(n - 1) * size] * n


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ring_matches_builtin_allreduce_and_sends_exact_bytes(world_size: int) -> None:
    """Ring / reduce-broadcast / all-to-all == dist.all_reduce; bytes per rank from the trace."""
    _check(world_size)


def test_ring_bytes_per_rank_exact_when_divisible() -> None:
    """Every rank sends exactly 2(n-1)/n x size when n divides the element count (n=4)."""
    res = launch(record_ring, 4, 8, timeout_s=60)
    for r in res.results:
        sent = sum(t["bytes"] for t in r["transfers"])
        assert sent == 2 * 3 * (8 * 4) // 4, f"rank {r['rank']} sent {sent} bytes"
        assert r["result"] == res.results[0]["result"], f"rank {r['rank']} result differs"
    starts = [r["start"] for r in res.results]
    assert res.results[0]["result"] == [sum(c) for c in zip(*starts)]

