"""Ring attention on real gloo ranks equals one process's attention, forward and backward;
its bytes and its zig-zag balance are the ones ``labkit.theory.context`` predicts.

One launch per world size runs every case on the same random q, k, v (whole sequence on
every rank, each rank cutting out its own tokens): causal with zig-zag, causal with plain
chunking, non-causal, and packed sequences with document masks (causal within a document,
and not). float64 makes the comparison tight (about 1e-15); the lab's bar is 1e-5. One
float32 case holds the same 1e-5 (values of order 1, 32-64 keys per softmax: rounding is
about 1e-7).
"""

from __future__ import annotations

from typing import Any

import pytest

from labkit.api import launch
from labkit.base.events import Op
from labkit.theory.context import blocks_per_step, ring_attention_traffic, unmasked_scores_per_rank

pytestmark = [pytest.mark.distributed]

TOL = 1e-5
BATCH, HEADS, SEQ, HEAD_DIM = 2, 3, 32, 8
DOCS = [[0] * 5 + [1] * 13 + [2] * 14, [0] * 20 + [1] * 12]
"""Two packed rows whose documents straddle chunks and ranks (32 tokens, chunks of 8 or 4)."""
CASES: dict[str, dict[str, Any]] = {
    "causal zigzag": {"causal": True, "zigzag": True},
    "causal plain": {"causal": True, "zigzag": False},
    "non-causal": {"causal": False, "zigzag": False},
    "documents causal": {"causal": True, "zigzag": True, "docs": True},
    "documents non-causal": {"causal": False, "zigzag": False, "docs": True},
    "causal zigzag float32": {"causal": True, "zigzag": True, "float32": True},
}


def _reference(q: Any, k: Any, v: Any, causal: bool, docs: Any) -> Any:
    """One process: plain softmax attention over the whole sequence, with its mask."""
    import torch

    from labkit.train.parallel.attention_blocks import attention_mask

    pos = torch.arange(q.shape[-2])
    mask = attention_mask(pos, pos, causal=causal, q_doc=docs, k_doc=docs)
    scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _compare(ctx: Any) -> dict[str, Any]:
    import torch

    from labkit.train.parallel.attention_blocks import shard
    from labkit.train.parallel.ring_attention import Ring, ring_attention

    rank, n = ctx.rank, ctx.world_size
    out: dict[str, Any] = {"rank": rank}
    for step, (name, case) in enumerate(CASES.items()):
        dtype = torch.float32 if case.get("float32") else torch.float64
        g = torch.Generator().manual_seed(step)
        q, k, v, grad = (torch.randn(BATCH, HEADS, SEQ, HEAD_DIM, generator=g, dtype=dtype)
                         for _ in range(4))
        docs = torch.tensor(DOCS) if case.get("docs") else None
        # 1. one process, whole sequence
        whole = [x.clone().requires_grad_() for x in (q, k, v)]
        _reference(*whole, case["causal"], docs).backward(grad)
        # 2. this rank's tokens through the ring
        zz = case["zigzag"]
        mine = [shard(x, rank, n, zigzag=zz).requires_grad_() for x in (q, k, v)]
        ring = Ring(ctx.comm, SEQ, causal=case["causal"], zigzag=zz, doc_ids=docs, step=step)
        got = ring_attention(*mine, ring)
        got.backward(shard(grad, rank, n, zigzag=zz))
        expected = _reference(q, k, v, case["causal"], docs)
        pairs = {"output": (got, expected)}
        pairs.update({f"d{t}": (m.grad, w.grad) for t, m, w in zip("qkv", mine, whole)})
        out[name] = {"diffs": {key: float((a - shard(b, rank, n, zigzag=zz)).abs().max())
                               for key, (a, b) in pairs.items()},
                     "blocks_per_step": ring.stats.blocks_per_step,
                     "unmasked_scores": ring.stats.unmasked_scores,
                     "step": step, "bytes_per_value": dtype.itemsize}
    return out


@pytest.mark.parametrize("world_size", [2, 4])
def test_ring_attention_equals_one_process_and_sends_the_predicted_bytes(world_size: int) -> None:
    """Every case: output, dq, dk, dv on every rank within 1e-5 of one process. Bytes each
    rank sent, read from the trace, == ring_attention_traffic (forward: cp-1 K/V blocks;
    backward: cp-1 K/V blocks and cp dK/dV blocks). Causal blocks computed per ring step ==
    blocks_per_step, and the unmasked scores == unmasked_scores_per_rank."""
    res = launch(_compare, world_size, timeout_s=120)
    tl = res.timeline
    for r in res.results:
        rank = r["rank"]
        for name, case in CASES.items():
            got = r[name]
            for key, diff in got["diffs"].items():
                assert diff <= TOL, (f"rank {rank} of {world_size}, {name}: {key} differs from "
                                     f"one process by {diff:.3g} (> {TOL})")
            pred = ring_attention_traffic(BATCH, SEQ, HEADS, HEAD_DIM, world_size,
                                          bytes_per_value=got["bytes_per_value"])
            sends = tl.select(rank=rank, op=Op.SEND, step=got["step"])
            forward = sum(e.bytes or 0 for e in sends if e.name == "kv")
            backward = sum(e.bytes or 0 for e in sends if e.name in ("kv bwd", "dkv bwd"))
            assert (forward, backward) == (pred["forward"], pred["backward"]), (
                f"rank {rank}, {name}: sent forward {forward} B, backward {backward} B; "
                f"predicted {pred['forward']} and {pred['backward']}")
            assert all(e.peer == (rank + 1) % world_size for e in sends), (
                f"rank {rank}, {name}: a send went elsewhere than the next rank")
            if not case.get("docs"):
                zz, causal = case["zigzag"], case["causal"]
                assert got["blocks_per_step"] == blocks_per_step(
                    rank, world_size, zigzag=zz, causal=causal), (rank, name, got)
                assert got["unmasked_scores"] == unmasked_scores_per_rank(
                    SEQ, world_size, zigzag=zz, causal=causal)[rank], (rank, name, got)
        # the compute of every ring step is on the timeline, named for the keys it used
        spans = [e for e in tl.select(rank=rank, op=Op.FORWARD, step=0) if e.name]
        assert [(e.chunk, e.name) for e in spans] == [
            (t, f"attn kv{(rank - t) % world_size}") for t in range(world_size)], spans


@pytest.mark.parametrize("world_size", [2, 4])
def test_zigzag_balances_causal_work_and_plain_chunking_does_not(world_size: int) -> None:
    """Measured on real ranks: with zig-zag chunks every rank computes the same number of
    causal chunk blocks (2*cp + 1) and the same unmasked scores; with plain chunking the
    last rank computes more than the first (4*rank + 3 blocks)."""
    res = launch(_balance, world_size, timeout_s=120)
    zigzag = [r["zigzag"] for r in res.results]
    plain = [r["plain"] for r in res.results]
    assert len({b for b, _ in zigzag}) == 1 and len({s for _, s in zigzag}) == 1, zigzag
    assert zigzag[0][0] == 2 * world_size + 1, zigzag
    assert [b for b, _ in plain] == [4 * r + 3 for r in range(world_size)], plain
    assert plain[-1][1] > plain[0][1], plain


def _balance(ctx: Any) -> dict[str, tuple[int, int]]:
    import torch

    from labkit.train.parallel.attention_blocks import shard
    from labkit.train.parallel.ring_attention import Ring, ring_attention

    out = {}
    for step, zigzag in enumerate((True, False)):
        x = torch.randn(1, 2, 16 * ctx.world_size, 8, generator=torch.Generator().manual_seed(1))
        mine = shard(x, ctx.rank, ctx.world_size, zigzag=zigzag)
        ring = Ring(ctx.comm, x.shape[-2], causal=True, zigzag=zigzag, step=step)
        ring_attention(mine, mine, mine, ring)
        out["zigzag" if zigzag else "plain"] = (sum(ring.stats.blocks_per_step),
                                               ring.stats.unmasked_scores)
    return out
