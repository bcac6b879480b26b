"""Attention one block at a time: the pure pieces ring attention is built from.

No communication here, so each piece is testable on its own:

* ``block_attention``: softmax attention of some queries over one block of keys, returned
  as a *partial* result: the block's output and the log-sum-exp of its scores per query.
* ``merge_partials``: the online-softmax rule (Milakov & Gimelshein 2018; flash attention,
  Dao et al. 2022): two partial results over disjoint key sets combine into the result over
  their union, ``lse = log(e^lse1 + e^lse2)``, ``out = e^(lse1-lse) out1 + e^(lse2-lse) out2``.
  Merging every block's partial in any order gives softmax over all keys, exactly.
* ``block_grads``: the backward of one block from the *final* log-sum-exp (the block's
  probabilities are ``exp(S - lse)``), as flash attention's backward recomputes them
  instead of keeping them: ``dV = P^T dO``, ``dS = P (dO V^T - D)`` with
  ``D = rowsum(dO * O)``, ``dQ = dS K scale``, ``dK = dS^T Q scale``.
* ``attention_mask``: which scores count, from each token's global position and document
  id: causal (key position <= query position) and/or same document (packed sequences).
* ``shard_positions`` / ``shard`` / ``unshard``: the sequence layout over ``cp`` ranks,
  zig-zag or plain, from ``labkit.theory.context.rank_chunks``.

A query row whose keys are all masked in a block has ``lse = -inf`` and output 0, and
merges as "no information": that is what lets a rank skip or mask blocks freely.
Tensors are ``(batch, heads, tokens, head_dim)``; masks broadcast as ``(batch or 1, 1,
queries, keys)`` with True where a score counts.
"""

from __future__ import annotations

import torch

from labkit.theory.context import rank_chunks

NEG_INF = float("-inf")


def attention_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, *, causal: bool,
                   q_doc: torch.Tensor | None = None,
                   k_doc: torch.Tensor | None = None) -> torch.Tensor | None:
    """Which (query, key) scores count, or None when all do. ``q_pos`` / ``k_pos``: global
    positions ``(tokens,)``; ``q_doc`` / ``k_doc``: document ids ``(tokens,)`` or
    ``(batch, tokens)`` (packed sequences: attention stays inside a document)."""
    mask: torch.Tensor | None = None
    if causal:
        mask = (k_pos[None, :] <= q_pos[:, None])[None, None]
    if q_doc is not None and k_doc is not None:
        same = (q_doc[..., :, None] == k_doc[..., None, :])
        same = same[None, None] if same.dim() == 2 else same[:, None]
        mask = same if mask is None else mask & same
    return mask


def block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                    mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial attention of ``q`` over one block of keys: ``(out, lse)`` with ``out`` the
    softmax-weighted values of this block alone and ``lse`` the log-sum-exp of its scores
    (``-inf`` and output 0 for a query whose keys are all masked)."""
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, NEG_INF)
    # 1. subtract the row maximum (0 for an all-masked row) so exp never overflows
    top = scores.amax(dim=-1, keepdim=True)
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    weights = torch.exp(scores - top)
    total = weights.sum(dim=-1, keepdim=True)
    # 2. normalise within the block; an all-masked row has total 0 and output 0
    out = torch.matmul(weights, v) / torch.where(total > 0, total, torch.ones_like(total))
    lse = (torch.log(total) + top).squeeze(-1)
    return out, lse


def merge_partials(out1: torch.Tensor, lse1: torch.Tensor, out2: torch.Tensor,
                   lse2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The online-softmax merge of two partial results over disjoint key sets."""
    lse = torch.logaddexp(lse1, lse2)
    # a row that saw no key in either part stays (0, -inf) instead of becoming NaN
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    w1, w2 = torch.exp(lse1 - safe), torch.exp(lse2 - safe)
    return w1.unsqueeze(-1) * out1 + w2.unsqueeze(-1) * out2, lse


def block_grads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor,
                delta: torch.Tensor, lse: torch.Tensor, scale: float,
                mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One block's share of ``(dq, dk, dv)``, given the final ``lse`` of these queries and
    ``delta = rowsum(dout * out)`` of the final output (both over *all* keys)."""
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, NEG_INF)
    # 1. the block's probabilities under the whole softmax, recomputed (exp(-inf) = 0)
    probs = torch.exp(scores - lse.unsqueeze(-1))
    # 2. the softmax backward: dS = P * (dP - D), with dP = dO V^T
    dv = torch.matmul(probs.transpose(-2, -1), dout)
    dscores = probs * (torch.matmul(dout, v.transpose(-2, -1)) - delta.unsqueeze(-1))
    dq = torch.matmul(dscores, k) * scale
    dk = torch.matmul(dscores.transpose(-2, -1), q) * scale
    return dq, dk, dv


# --- the sequence layout --------------------------------------------------------------------

def shard_positions(seq_len: int, rank: int, cp: int, *, zigzag: bool = True,
                    device: torch.device | str | None = None) -> torch.Tensor:
    """Global positions of the tokens ``rank`` holds, in its local order: its two chunks of
    ``seq_len / (2*cp)`` tokens (``labkit.theory.context.rank_chunks``)."""
    if seq_len % (2 * cp):
        raise ValueError(f"seq_len ({seq_len}) must be a multiple of 2 x cp ({2 * cp}) to cut "
                         f"it into 2*cp chunks; e.g. seq_len={4 * cp}")
    m = seq_len // (2 * cp)
    return torch.cat([torch.arange(c * m, (c + 1) * m, device=device)
                      for c in rank_chunks(rank, cp, zigzag=zigzag)])


def shard(x: torch.Tensor, rank: int, cp: int, *, zigzag: bool = True,
          dim: int = -2) -> torch.Tensor:
    """The part of a whole-sequence tensor ``x`` that ``rank`` holds (sequence on ``dim``)."""
    pos = shard_positions(x.shape[dim], rank, cp, zigzag=zigzag, device=x.device)
    return x.index_select(dim, pos)


def unshard(parts: list[torch.Tensor], *, zigzag: bool = True, dim: int = -2) -> torch.Tensor:
    """The whole sequence back from every rank's part (index = rank): ``shard``'s inverse."""
    cp = len(parts)
    seq_len = sum(p.shape[dim] for p in parts)
    pos = torch.cat([shard_positions(seq_len, r, cp, zigzag=zigzag, device=parts[0].device)
                     for r in range(cp)])
    whole = torch.cat(parts, dim=dim)
    return whole.index_select(dim, torch.argsort(pos))
