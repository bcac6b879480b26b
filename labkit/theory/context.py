"""Context parallelism: ring attention's memory, traffic, overlap and zig-zag balance.

Teaches why attention memory grows with the *square* of the sequence and what splitting
the sequence over a ``cp`` group of ranks buys. Ring attention (Liu et al. 2023, "Ring
Attention with Blockwise Transformers for Near-Infinite Context") keeps each rank's
queries in place and passes the key/value blocks around a ring; each rank merges the
partial results with the online-softmax rule (Milakov & Gimelshein 2018; flash attention,
Dao et al. 2022), so no rank ever holds more than one block of scores.

Notation: s = sequence length, b = micro-batch, h = hidden size, a = attention heads,
d = head dimension (h = a*d for keys and values), cp = ranks in the ring.

* **Memory** (``attention_activation_bytes``): plain attention keeps, per layer,
  ``11*s*b*h + 5*a*s^2*b`` bytes (Korthikanti et al. 2022, section 4.1: the 11 are Q, K, V,
  the attention input, its output and dropout, the 5 the softmax output, its dropout mask
  and dropout output, 16-bit values and 1-byte masks). Ring attention divides the linear
  part by cp and computes one (s/cp) x (s/cp) block of scores at a time; the backward
  recomputes each block from the saved log-sum-exp (4 bytes per query and head), so the
  s^2 term falls by cp^2, not just cp. A ring that let autograd keep every block would
  only divide it by cp (``ring_recompute=False``).
* **Traffic** (``ring_attention_traffic``): forward, every rank sends its K and V block on
  cp-1 times (``2*b*(s/cp)*h`` values each time); backward, K and V go around again
  (cp-1 sends) and the gradients dK, dV travel with them, one more step to get home
  (cp sends): ``(2*cp - 1)`` blocks. picotron's ``context_parallel`` does the same.
* **Overlap** (``ring_overlap``): a rank posts the send of the block it holds, then
  computes on it; the send is hidden when one block's attention FLOPs (``4*b*a*c^2*d`` for
  a block of c = s/cp queries and keys) take longer than one block's bytes take on the
  link: ``c >= bytes_per_value * F / (2 * B)``, independent of b, a and d.
* **Zig-zag** (``rank_chunks``, ``blocks_per_step``): with causal attention the query at
  position p sees only keys <= p, so plain chunking gives the last rank cp times the work of
  the first. Cutting the sequence into 2*cp chunks and giving rank i chunks i and
  2*cp-1-i (Llama 3, Dubey et al. 2024, section 3.3.2, whose CP gathers K/V with an
  all-gather rather than a ring; zhuzilin/ring-flash-attention's zigzag) gives every rank
  2*cp+1 unmasked chunk blocks, and the same number (2) at every ring step after the first.

Pure Python, no torch: ``labkit.train.parallel.ring_attention`` reads its chunk map from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.base.errors import ConfigError
from labkit.theory.batch import check_int, check_number

ATTENTION_LINEAR_BYTES = 11
"""Bytes per s*b*h that one layer's attention block keeps besides the scores (Korthikanti
et al. 2022, section 4.1: of the layer's 34)."""
SCORE_BYTES = 5
"""Bytes per score a*s*s*b that plain attention keeps (softmax output 2, dropout mask 1,
dropout output 2; Korthikanti et al. 2022)."""
LSE_BYTES = 4
"""Bytes per query and head of the log-sum-exp ring attention saves for its backward (fp32)."""


def _check_split(seq: int, cp: int, parts: int) -> tuple[int, int]:
    s = check_int("seq", seq, 1, "seq=4096")
    n = check_int("cp", cp, 1, "cp=4")
    if s % (parts * n):
        raise ConfigError(f"seq ({s}) must be a multiple of {parts} x cp ({parts} x {n} = "
                          f"{parts * n}); e.g. seq={parts * n * max(1, s // (parts * n))}")
    return s, n


# --- the layout: which chunks a rank holds ---------------------------------------------------

def rank_chunks(rank: int, cp: int, *, zigzag: bool = True) -> tuple[int, int]:
    """The two of ``2*cp`` equal chunks of the sequence that ``rank`` holds, in its order.

    Zig-zag: chunks ``rank`` and ``2*cp-1-rank`` (one early, one late: balanced causal work).
    Plain: ``2*rank`` and ``2*rank+1`` (one contiguous slice of s/cp tokens).
    """
    n = check_int("cp", cp, 1, "cp=4")
    r = check_int("rank", rank, 0, "rank=0")
    if r >= n:
        raise ConfigError(f"rank ({r}) must be < cp ({n}); e.g. rank={n - 1}")
    return (r, 2 * n - 1 - r) if zigzag else (2 * r, 2 * r + 1)


def chunk_owner(chunk: int, cp: int, *, zigzag: bool = True) -> int:
    """The rank that holds ``chunk`` (of ``2*cp``): the inverse of ``rank_chunks``."""
    n = check_int("cp", cp, 1, "cp=4")
    c = check_int("chunk", chunk, 0, "chunk=0")
    if c >= 2 * n:
        raise ConfigError(f"chunk ({c}) must be < 2 x cp ({2 * n}); e.g. chunk={2 * n - 1}")
    if not zigzag:
        return c // 2
    return c if c < n else 2 * n - 1 - c


def blocks_per_step(rank: int, cp: int, *, zigzag: bool = True, causal: bool = True) -> list[int]:
    """Chunk blocks (query chunk, key chunk) with at least one unmasked score that ``rank``
    computes at each ring step; at step t it holds the keys and values of rank
    ``(rank - t) % cp``. Each rank's two query chunks meet the held block's two key chunks:
    4 blocks without a mask; causal attention skips a block whose keys all come later."""
    mine = rank_chunks(rank, cp, zigzag=zigzag)
    out = []
    for step in range(cp):
        held = rank_chunks((rank - step) % cp, cp, zigzag=zigzag)
        out.append(sum(1 for q in mine for k in held if not causal or k <= q))
    return out


def score_blocks_per_rank(cp: int, *, zigzag: bool = True, causal: bool = True) -> list[int]:
    """Unmasked chunk blocks each rank computes over the whole ring (index = rank):
    zig-zag gives every rank ``2*cp + 1`` causal blocks, plain chunking ``4*rank + 3``."""
    n = check_int("cp", cp, 1, "cp=4")
    return [sum(blocks_per_step(r, n, zigzag=zigzag, causal=causal)) for r in range(n)]


def unmasked_scores_per_rank(seq: int, cp: int, *, zigzag: bool = True,
                             causal: bool = True) -> list[int]:
    """Query-key pairs with an unmasked score each rank computes (one sequence, one head).

    A chunk c of m = s/(2*cp) queries sees ``m*m*c + m*(m+1)/2`` keys under a causal mask
    (every earlier chunk whole, its own as a triangle), ``m*s`` without one."""
    s, n = _check_split(seq, cp, 2)
    m = s // (2 * n)

    def seen(chunk: int) -> int:
        return m * m * chunk + m * (m + 1) // 2 if causal else m * s

    return [sum(seen(c) for c in rank_chunks(r, n, zigzag=zigzag)) for r in range(n)]


# --- memory ------------------------------------------------------------------------------

def attention_score_bytes(seq: int, batch: int, heads: int, *, cp: int = 1,
                          ring_recompute: bool = True) -> float:
    """The s^2 term of attention's activation memory on one rank.

    ``cp == 1``: Korthikanti et al.'s ``5*a*s^2*b``. Ring attention: one block of
    ``(s/cp)^2`` scores at a time (``5*a*(s/cp)^2*b``) when its backward recomputes the
    blocks from the log-sum-exp, ``cp`` such blocks (``5*a*s^2*b/cp``) when autograd keeps
    them all (``ring_recompute=False``)."""
    s, n = _check_split(seq, cp, 1)
    b = check_int("batch", batch, 1, "batch=1")
    a = check_int("heads", heads, 1, "heads=32")
    block = float(SCORE_BYTES * a * b * (s // n) ** 2)
    return block if ring_recompute or n == 1 else block * n


def attention_activation_bytes(seq: int, batch: int, hidden: int, heads: int, *, cp: int = 1,
                               ring_recompute: bool = True) -> float:
    """Bytes one layer's attention keeps for backward on one rank.

    ``cp == 1``: ``11*s*b*h + 5*a*s^2*b`` (Korthikanti et al. 2022). Ring attention over
    ``cp`` ranks: ``11*(s/cp)*b*h`` plus ``attention_score_bytes`` plus, when the blocks
    are recomputed, the saved log-sum-exp (``4*a*b*s/cp``). The received K/V buffer is
    transient and not counted."""
    s, n = _check_split(seq, cp, 1)
    b = check_int("batch", batch, 1, "batch=1")
    h = check_int("hidden", hidden, 1, "hidden=4096")
    a = check_int("heads", heads, 1, "heads=32")
    local = s // n
    linear = float(ATTENTION_LINEAR_BYTES * local * b * h)
    scores = attention_score_bytes(s, b, a, cp=n, ring_recompute=ring_recompute)
    lse = float(LSE_BYTES * a * b * local) if n > 1 and ring_recompute else 0.0
    return linear + scores + lse


# --- traffic -----------------------------------------------------------------------------

def ring_kv_block_bytes(batch: int, seq: int, heads: int, head_dim: int, cp: int,
                        bytes_per_value: int = 2) -> int:
    """Bytes of one K-and-V block a rank passes on: ``2*b*(s/cp)*a*d*bytes_per_value``."""
    s, n = _check_split(seq, cp, 1)
    b = check_int("batch", batch, 1, "batch=1")
    a = check_int("heads", heads, 1, "heads=8 (key/value heads)")
    d = check_int("head_dim", head_dim, 1, "head_dim=128")
    bpv = check_int("bytes_per_value", bytes_per_value, 1, "bytes_per_value=2")
    return 2 * b * (s // n) * a * d * bpv


def ring_attention_traffic(batch: int, seq: int, heads: int, head_dim: int, cp: int,
                           bytes_per_value: int = 2,
                           grad_bytes_per_value: int | None = None) -> dict[str, int]:
    """Bytes each rank sends for one attention layer: ``forward`` = (cp-1) K/V blocks;
    ``backward`` = (cp-1) K/V blocks plus cp dK/dV blocks (the last one takes the gradient
    home to the rank that owns the keys); ``block`` = one K/V block. Nothing with cp = 1.
    ``grad_bytes_per_value``: the dK/dV blocks' (labkit sums them in float32 at least, so 4
    for 16-bit inputs); default ``bytes_per_value``."""
    block = ring_kv_block_bytes(batch, seq, heads, head_dim, cp, bytes_per_value)
    gbpv = bytes_per_value if grad_bytes_per_value is None else grad_bytes_per_value
    grad_block = ring_kv_block_bytes(batch, seq, heads, head_dim, cp, gbpv)
    homeward = cp * grad_block if cp > 1 else 0
    return {"forward": (cp - 1) * block, "backward": (cp - 1) * block + homeward,
            "block": block}


# --- overlap -------------------------------------------------------------------------------

def ring_step_flops(batch: int, seq: int, heads: int, head_dim: int, cp: int, *,
                    causal: bool = False) -> float:
    """Forward FLOPs of one ring step on one rank: ``Q K^T`` and ``P V`` over a block of
    c = s/cp queries and keys, ``4*b*a*c^2*d``. ``causal`` (with zig-zag): a step after the
    first computes half a block (2 of its 4 chunk blocks)."""
    s, n = _check_split(seq, cp, 2 if causal else 1)
    b = check_int("batch", batch, 1, "batch=1")
    a = check_int("heads", heads, 1, "heads=32")
    d = check_int("head_dim", head_dim, 1, "head_dim=128")
    full = 4.0 * b * a * (s // n) ** 2 * d
    return full / 2 if causal else full


def min_block_tokens(flops_per_s: float, bandwidth_Bps: float, bytes_per_value: int = 2, *,
                     causal: bool = False) -> float:
    """Tokens per rank (c = s/cp) above which one block's attention hides one K/V send:
    ``4*b*a*c^2*d / F >= 2*b*c*a*d*bytes / B``, so ``c >= bytes * F / (2*B)`` (twice that
    under a causal zig-zag mask, whose steps compute half a block)."""
    f = check_number("flops_per_s", flops_per_s, "flops_per_s=989e12", allow_equal=False)
    bw = check_number("bandwidth_Bps", bandwidth_Bps, "bandwidth_Bps=450e9", allow_equal=False)
    bpv = check_int("bytes_per_value", bytes_per_value, 1, "bytes_per_value=2")
    c = bpv * f / (2 * bw)
    return 2 * c if causal else c


@dataclass(frozen=True)
class RingOverlap:
    """One ring step: the compute that can hide the send, and the send."""

    compute_s: float
    """Seconds of one block's attention at the given FLOP rate."""
    comm_s: float
    """Seconds one K/V block takes on the link (latency + bytes / bandwidth)."""
    hidden: bool
    """True when the compute covers the send (``compute_s >= comm_s``)."""
    min_block_tokens: float
    """Tokens per rank above which the send is hidden (latency left out)."""


def ring_overlap(batch: int, seq: int, heads: int, head_dim: int, cp: int, *,
                 flops_per_s: float, bandwidth_Bps: float, bytes_per_value: int = 2,
                 latency_s: float = 0.0, causal: bool = False) -> RingOverlap:
    """Does one block's attention hide one K/V block's send? (forward, one rank)"""
    flops = ring_step_flops(batch, seq, heads, head_dim, cp, causal=causal)
    f = check_number("flops_per_s", flops_per_s, "flops_per_s=989e12", allow_equal=False)
    bw = check_number("bandwidth_Bps", bandwidth_Bps, "bandwidth_Bps=450e9", allow_equal=False)
    alpha = check_number("latency_s", latency_s, "latency_s=5e-6")
    block = ring_kv_block_bytes(batch, seq, heads, head_dim, cp, bytes_per_value)
    compute_s, comm_s = flops / f, alpha + block / bw
    return RingOverlap(compute_s=compute_s, comm_s=comm_s, hidden=compute_s >= comm_s,
                       min_block_tokens=min_block_tokens(f, bw, bytes_per_value, causal=causal))
