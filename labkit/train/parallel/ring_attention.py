"""Ring attention: softmax attention over a sequence split across a context-parallel group.

Liu et al. 2023, "Ring Attention with Blockwise Transformers for Near-Infinite Context";
the layout and the backward follow picotron's ``context_parallel`` and
zhuzilin/ring-flash-attention. Each of the ``cp`` ranks holds s/cp tokens of the sequence:
their queries, keys and values. It keeps its queries and passes its key/value block around
the ring (rank r sends to r+1, receives from r-1), so at ring step t it holds the block of
rank ``(r - t) % cp``. The block's attention is a *partial* result (output and log-sum-exp
per query) that the online-softmax rule merges into the running one
(``attention_blocks.merge_partials``); after cp steps every query has seen every key, and
the result equals one process's softmax attention exactly (up to float rounding).

Forward, per step:

1. post the send of the block held (to r+1) and the receive of the next (from r-1) first,
2. compute on the held block while the bytes travel (the overlap the timeline shows),
3. wait for the next block.

Backward (``RingAttention.backward``) is distributed the same way: the K/V blocks go round
again, each rank recomputes its queries' probabilities against the held block from the saved
log-sum-exp (as flash attention does; no block of scores is kept between the passes), adds
its share of that block's dK and dV to the partial sums that travel *with* the block, and
passes them on; one more step takes the finished dK, dV home to their owner. Traffic per rank:
``labkit.theory.context.ring_attention_traffic``. On the timeline the sends are named ``kv``
(forward), ``kv bwd`` and ``dkv bwd`` (backward), with the ring step as ``chunk``; each
step's compute is a detail span ``attn kvJ`` (J: the rank whose keys it used).

Masks: ``causal`` (a key counts when its global position is <= the query's), and
``doc_ids`` (packed sequences: a document id per token; attention stays inside a document,
causal within it when ``causal``). Each rank's tokens are two chunks of s/(2*cp) tokens;
a chunk block whose scores are all masked is skipped, never computed. With ``zigzag``
(rank i holds chunks i and 2cp-1-i) causal work is the same on every rank at every step
after the first; plain chunking (chunks 2i and 2i+1) is not
(``labkit.theory.context.blocks_per_step``; ``RingStats`` counts what was computed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from labkit.base.events import Op
from labkit.trace.comm import Comm, Handle
from labkit.train.parallel.attention_blocks import (
    attention_mask,
    block_attention,
    block_grads,
    merge_partials,
    shard_positions,
)


@dataclass
class RingStats:
    """What one rank computed in its forward passes, counted as it went."""

    blocks_per_step: list[int] = field(default_factory=list)
    """Chunk blocks (query chunk x key chunk) computed at each ring step of the last forward."""
    unmasked_scores: int = 0
    """Query-key pairs whose score counted, over every forward (summed over the mask's batch
    rows when document ids differ per sequence, else one sequence); one head."""


@dataclass
class Ring:
    """A context-parallel group and the attention it computes (everything but q, k, v)."""

    comm: Comm
    """The traced ``Comm`` of the cp group; peers are group ranks (r+1, r-1 around the ring)."""
    seq_len: int
    """Tokens in the whole sequence (a multiple of 2*cp)."""
    causal: bool = True
    zigzag: bool = True
    """Rank i holds chunks i and 2cp-1-i of 2cp (else 2i and 2i+1)."""
    doc_ids: torch.Tensor | None = None
    """Document id of every token of the whole sequence, ``(seq_len,)`` or
    ``(batch, seq_len)`` (packed sequences); None: one document."""
    scale: float | None = None
    """Score scale; None: 1/sqrt(head_dim)."""
    step: int | None = None
    """Training step recorded on the spans."""
    tag: int = 700
    """Base tag of the ring's messages (K/V forward, K/V backward, dK/dV: tag, +1, +2)."""
    stats: RingStats = field(default_factory=RingStats)

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def cp(self) -> int:
        return self.comm.world_size

    def tokens(self, rank: int, device: torch.device
               ) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """Global positions and document ids of ``rank``'s two chunks."""
        pos = shard_positions(self.seq_len, rank, self.cp, zigzag=self.zigzag, device=device)
        halves = list(pos.chunk(2))
        docs = self.doc_ids.to(device) if self.doc_ids is not None else None
        return halves, [docs[..., h] if docs is not None else None for h in halves]

    def masks(self, held: int, device: torch.device) -> dict[tuple[int, int], torch.Tensor | None]:
        """The chunk blocks (query chunk, key chunk) of this rank against ``held``'s keys
        that have any unmasked score, with their masks (None: nothing masked)."""
        q_pos, q_doc = self.tokens(self.rank, device)
        k_pos, k_doc = self.tokens(held, device)
        out: dict[tuple[int, int], torch.Tensor | None] = {}
        for i in range(2):
            for j in range(2):
                mask = attention_mask(q_pos[i], k_pos[j], causal=self.causal,
                                      q_doc=q_doc[i], k_doc=k_doc[j])
                if mask is None or bool(mask.any()):
                    out[(i, j)] = mask
        return out

    def pass_on(self, tensor: torch.Tensor, tag_offset: int, name: str, ring_step: int
                ) -> tuple[torch.Tensor, Handle, Handle]:
        """Post the send of ``tensor`` to r+1 and the receive of r-1's into a new buffer;
        returns ``(buffer, send, recv)``."""
        incoming = torch.empty_like(tensor)
        meta = {"step": self.step, "name": name, "chunk": ring_step}
        tag = self.tag + tag_offset
        recv = self.comm.irecv(incoming, (self.rank - 1) % self.cp, tag=tag, **meta)
        send = self.comm.isend(tensor, (self.rank + 1) % self.cp, tag=tag, **meta)
        return incoming, send, recv

    def span(self, op: Op, ring_step: int, held: int) -> Any:
        return self.comm.tracer.detail(op, step=self.step, chunk=ring_step, name=f"attn kv{held}")


class RingAttention(torch.autograd.Function):
    """Forward: ring attention (module docstring). Backward: dQ stays, dK and dV travel the
    ring with their K/V block and come home after cp steps."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                ring: Ring) -> torch.Tensor:
        acc = torch.promote_types(q.dtype, torch.float32)
        scale = ring.scale if ring.scale is not None else q.shape[-1] ** -0.5
        qc = q.to(acc).chunk(2, dim=-2)
        outs: list[tuple[torch.Tensor, torch.Tensor] | None] = [None, None]
        kv = torch.stack([k, v]).contiguous()
        ring.stats.blocks_per_step = []
        for t in range(ring.cp):
            held = (ring.rank - t) % ring.cp
            # 1. send the block held on before computing with it: the bytes travel meanwhile
            exchange = ring.pass_on(kv, 0, "kv", t) if t < ring.cp - 1 else None
            # 2. this rank's queries against the held keys, chunk block by chunk block
            masks = ring.masks(held, q.device)
            kc, vc = kv[0].to(acc).chunk(2, dim=-2), kv[1].to(acc).chunk(2, dim=-2)
            with ring.span(Op.FORWARD, t, held):
                for (i, j), mask in masks.items():
                    part = block_attention(qc[i], kc[j], vc[j], scale, mask)
                    seen = outs[i]
                    outs[i] = part if seen is None else merge_partials(*seen, *part)
                    ring.stats.unmasked_scores += (qc[i].shape[-2] * kc[j].shape[-2]
                                                   if mask is None else int(mask.sum()))
            ring.stats.blocks_per_step.append(len(masks))
            # 3. the next block must have arrived before the next step computes with it
            if exchange is not None:
                kv, send, recv = exchange
                recv.wait()
                send.wait()
        out, lse = _whole(outs, qc)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.scale = ring, scale
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        ring, scale = ctx.ring, ctx.scale
        acc = out.dtype
        dout = dout.to(acc)
        delta = (dout * out).sum(dim=-1)
        qc, doc, lsec, dc = (q.to(acc).chunk(2, dim=-2), dout.chunk(2, dim=-2),
                             lse.chunk(2, dim=-1), delta.chunk(2, dim=-1))
        dq = [torch.zeros_like(c) for c in qc]
        kv = torch.stack([k, v]).contiguous()
        grads: tuple[torch.Tensor, Handle, Handle] | None = None  # dK/dV on their way
        sent: tuple[torch.Tensor, Handle] | None = None  # the last dK/dV sent, kept alive
        for t in range(ring.cp):
            held = (ring.rank - t) % ring.cp
            # 1. K/V go round again; post the exchange before computing
            exchange = ring.pass_on(kv, 1, "kv bwd", t) if t < ring.cp - 1 else None
            # 2. this rank's share of the held block's gradients (and of its own dQ)
            kc, vc = kv[0].to(acc).chunk(2, dim=-2), kv[1].to(acc).chunk(2, dim=-2)
            dkv = torch.zeros((2, *kv.shape[1:]), dtype=acc, device=kv.device)
            dk, dv = dkv[0].chunk(2, dim=-2), dkv[1].chunk(2, dim=-2)
            with ring.span(Op.BACKWARD, t, held):
                for (i, j), mask in ring.masks(held, q.device).items():
                    g_q, g_k, g_v = block_grads(qc[i], kc[j], vc[j], doc[i], dc[i], lsec[i],
                                                scale, mask)
                    dq[i] += g_q
                    dk[j].add_(g_k)
                    dv[j].add_(g_v)
            # 3. add what the ranks before this one gave the block, and pass the sum on
            if grads is not None:
                earlier, _, recv = grads
                recv.wait()
                dkv += earlier
            if ring.cp > 1:  # one rank: the block is home already
                if sent is not None:
                    sent[1].wait()
                grads = ring.pass_on(dkv, 2, "dkv bwd", t)
                sent = (dkv, grads[1])
            if exchange is not None:
                kv, send, recv = exchange
                recv.wait()
                send.wait()
        # 4. the last block received is this rank's own, with every rank's share in it
        home = dkv  # (one rank: its own block, computed at step 0)
        if grads is not None:
            home, _, recv = grads
            recv.wait()
        if sent is not None:
            sent[1].wait()
        return torch.cat(dq, dim=-2).to(q.dtype), home[0].to(k.dtype), home[1].to(v.dtype), None


def _whole(outs: list[tuple[torch.Tensor, torch.Tensor] | None],
           qc: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Both chunks' (output, lse) joined; a chunk that saw no key at all: 0 and -inf."""
    parts = [o if o is not None else
             (torch.zeros_like(c), torch.full(c.shape[:-1], float("-inf"), dtype=c.dtype,
                                              device=c.device))
             for o, c in zip(outs, qc)]
    return torch.cat([p[0] for p in parts], dim=-2), torch.cat([p[1] for p in parts], dim=-1)


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: Ring) -> torch.Tensor:
    """Attention of this rank's queries over the whole sequence's keys and values, which
    sit on the ``ring.cp`` ranks of ``ring.comm``. ``q``, ``k``, ``v``: this rank's tokens,
    ``(batch, heads, seq_len / cp, head_dim)``, in ``shard_positions`` order (use
    ``attention_blocks.shard``); returns the output for the same tokens. Differentiable:
    the backward talks to the ring too, so every rank must call backward."""
    expected = ring.seq_len // ring.cp
    if q.shape[-2] != expected or k.shape != v.shape or k.shape[-2] != expected:
        raise ValueError(f"ring attention over seq_len {ring.seq_len} on cp {ring.cp} ranks "
                         f"needs {expected} tokens per rank; got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    return RingAttention.apply(q, k, v, ring)  # type: ignore[no-any-return]
