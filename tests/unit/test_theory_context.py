"""Context parallelism's formulas (``labkit.theory.context``) with worked numbers, and the
pure pieces of ring attention (``labkit.train.parallel.attention_blocks``) without ranks."""

from __future__ import annotations

import pytest
import torch

from labkit.base.errors import ConfigError
from labkit.theory import (
    attention_activation_bytes,
    attention_score_bytes,
    blocks_per_step,
    chunk_owner,
    layer_activation_bytes,
    min_block_tokens,
    rank_chunks,
    ring_attention_traffic,
    ring_overlap,
    score_blocks_per_rank,
    unmasked_scores_per_rank,
)
from labkit.train.parallel.attention_blocks import (
    attention_mask,
    block_attention,
    block_grads,
    merge_partials,
    shard,
    shard_positions,
    unshard,
)

# --- memory ----------------------------------------------------------------------------------


def test_plain_attention_keeps_korthikantis_5as2b_and_the_layer_formula_agrees() -> None:
    """GPT-3 175B (a=96, s=2048, h=12288, b=1): the score term 5*a*s^2*b = 80*s*b*h
    (Korthikanti et al. 2022: 5as/h = 80 > 34); with the other 23 s*b*h of the layer it is
    ``layer_activation_bytes``."""
    s, b, h, a = 2048, 1, 12288, 96
    assert attention_score_bytes(s, b, a) == 5 * 96 * 2048**2 == 2_013_265_920
    assert attention_score_bytes(s, b, a) == 80 * s * b * h
    assert attention_activation_bytes(s, b, h, a) == 11 * s * b * h + 5 * a * s * s * b
    assert attention_activation_bytes(s, b, h, a) + 23 * s * b * h == layer_activation_bytes(
        s, b, h, a)


def test_ring_attention_divides_the_score_term_by_cp_squared_when_it_recomputes() -> None:
    """One (s/cp)^2 block at a time: cp=8 cuts 5as^2b by 64; a ring that kept every block
    would cut it by 8 only. Worked: s=8, b=1, h=4, a=2, cp=2 -> 11*4*4 + 5*2*16 + 4*2*4."""
    plain = attention_score_bytes(2048, 1, 96)
    assert attention_score_bytes(2048, 1, 96, cp=8) == plain / 64
    assert attention_score_bytes(2048, 1, 96, cp=8, ring_recompute=False) == plain / 8
    assert attention_activation_bytes(8, 1, 4, 2, cp=2) == 176 + 160 + 32 == 368
    assert attention_activation_bytes(8, 1, 4, 2, cp=2, ring_recompute=False) == 176 + 320


def test_memory_formulas_name_a_sequence_that_does_not_split() -> None:
    with pytest.raises(ConfigError, match=r"seq \(10\) must be a multiple of 1 x cp"):
        attention_score_bytes(10, 1, 2, cp=4)


# --- traffic and overlap ----------------------------------------------------------------------


def test_ring_traffic_for_llama3_style_128k_context_on_16_ranks() -> None:
    """b=1, s=131072, 8 key/value heads of 128, cp=16, bf16: one K/V block is
    2*8192*8*128*2 B = 32 MiB; forward 15 blocks; backward 15 K/V blocks and 16 dK/dV
    blocks (float32 gradients: 64 MiB each)."""
    t = ring_attention_traffic(1, 131072, 8, 128, 16, bytes_per_value=2, grad_bytes_per_value=4)
    mib = 2**20
    assert t["block"] == 32 * mib
    assert t["forward"] == 15 * 32 * mib
    assert t["backward"] == 15 * 32 * mib + 16 * 64 * mib
    same = ring_attention_traffic(2, 32, 3, 8, 4, bytes_per_value=8)
    assert same == {"block": 2 * 2 * 8 * 3 * 8 * 8, "forward": 3 * 6144, "backward": 7 * 6144}
    assert ring_attention_traffic(2, 32, 3, 8, 1) == {"block": 2 * 2 * 32 * 3 * 8 * 2,
                                                      "forward": 0, "backward": 0}


def test_overlap_needs_blocks_longer_than_bytes_times_flops_over_twice_the_bandwidth() -> None:
    """H100 bf16 (989 TFLOP/s) over NVLink (450 GB/s): c >= 2*989e12/(2*450e9) = 2198
    tokens per rank. 128K on 16 ranks (8192 each) hides the send; 16K on 16 (1024) does not."""
    assert min_block_tokens(989e12, 450e9, 2) == pytest.approx(2197.78, abs=0.01)
    assert min_block_tokens(989e12, 450e9, 2, causal=True) == pytest.approx(4395.56, abs=0.01)
    long = ring_overlap(1, 131072, 32, 128, 16, flops_per_s=989e12, bandwidth_Bps=450e9)
    assert long.compute_s == pytest.approx(4 * 32 * 8192**2 * 128 / 989e12)
    assert long.comm_s == pytest.approx(2 * 8192 * 32 * 128 * 2 / 450e9)
    assert long.hidden and long.compute_s / long.comm_s == pytest.approx(8192 / 2197.78, rel=1e-5)
    short = ring_overlap(1, 16384, 32, 128, 16, flops_per_s=989e12, bandwidth_Bps=450e9)
    assert not short.hidden


# --- zig-zag ----------------------------------------------------------------------------------


def test_zigzag_gives_rank_i_chunks_i_and_2cp_minus_1_minus_i() -> None:
    assert [rank_chunks(r, 4) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert [rank_chunks(r, 4, zigzag=False) for r in range(4)] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    for zigzag in (True, False):
        for c in range(8):
            assert c in rank_chunks(chunk_owner(c, 4, zigzag=zigzag), 4, zigzag=zigzag)
    with pytest.raises(ConfigError, match=r"rank \(4\) must be < cp \(4\)"):
        rank_chunks(4, 4)


def test_zigzag_balances_causal_blocks_and_plain_chunking_does_not() -> None:
    """cp=4: zig-zag 9 blocks on every rank (3 at the first step, 2 at each after);
    plain 3, 7, 11, 15 (the last rank waits for nobody, the first idles)."""
    assert score_blocks_per_rank(4) == [9, 9, 9, 9]
    assert score_blocks_per_rank(4, zigzag=False) == [3, 7, 11, 15]
    assert score_blocks_per_rank(4, causal=False) == [16, 16, 16, 16]
    assert [blocks_per_step(r, 4) for r in range(4)] == [[3, 2, 2, 2]] * 4
    assert blocks_per_step(0, 4, zigzag=False) == [3, 0, 0, 0]
    assert blocks_per_step(3, 4, zigzag=False) == [3, 4, 4, 4]


def test_unmasked_scores_are_equal_under_zigzag_and_sum_to_the_triangle() -> None:
    """s=16, cp=2, chunks of m=4: a chunk c sees 16c + 10 keys; zig-zag 68 and 68, plain
    36 and 100; either way 16*17/2 = 136 in all."""
    assert unmasked_scores_per_rank(16, 2) == [68, 68]
    assert unmasked_scores_per_rank(16, 2, zigzag=False) == [36, 100]
    for cp in (1, 2, 4, 8):
        assert sum(unmasked_scores_per_rank(64, cp)) == 64 * 65 // 2
        assert len(set(unmasked_scores_per_rank(64, cp))) == 1
    assert unmasked_scores_per_rank(16, 2, causal=False) == [128, 128]


# --- the pure pieces of ring attention ---------------------------------------------------------


def _qkv(seed: int, s: int = 12) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, s, 8, generator=g, dtype=torch.float64) for _ in range(3)]


def test_merging_two_halves_equals_softmax_over_the_whole() -> None:
    """Keys split into two arbitrary (non-contiguous) sets; each half's partial result,
    merged by the online-softmax rule, is softmax attention over all keys, lse included."""
    q, k, v = _qkv(0)
    scale = 8**-0.5
    scores = q @ k.transpose(-2, -1) * scale
    whole = torch.softmax(scores, -1) @ v
    first = torch.tensor([0, 2, 3, 7, 11])
    second = torch.tensor([1, 4, 5, 6, 8, 9, 10])
    a = block_attention(q, k[..., first, :], v[..., first, :], scale)
    b = block_attention(q, k[..., second, :], v[..., second, :], scale)
    for x, y in ((a, b), (b, a)):  # the rule is symmetric
        out, lse = merge_partials(*x, *y)
        assert (out - whole).abs().max() < 1e-14
        assert (lse - torch.logsumexp(scores, -1)).abs().max() < 1e-14


def test_a_fully_masked_part_merges_as_no_information() -> None:
    """A block whose keys are all masked for a query gives (0, -inf) and leaves the other
    part unchanged; two such parts stay (0, -inf), never NaN."""
    q, k, v = _qkv(1, s=4)
    nothing = torch.zeros(1, 1, 4, 4, dtype=torch.bool)
    out0, lse0 = block_attention(q, k, v, 0.5, nothing)
    assert (out0 == 0).all() and torch.isneginf(lse0).all()
    out1, lse1 = block_attention(q, k, v, 0.5)
    out, lse = merge_partials(out1, lse1, out0, lse0)
    assert torch.equal(out, out1) and torch.equal(lse, lse1)
    out, lse = merge_partials(out0, lse0, out0, lse0)
    assert (out == 0).all() and torch.isneginf(lse).all()


def test_block_gradients_summed_over_blocks_equal_autograd() -> None:
    """dq, dk, dv from ``block_grads`` over two key blocks (final lse, causal mask) equal
    torch's autograd through one softmax over all keys."""
    q, k, v = (x.requires_grad_() for x in _qkv(2))
    dout = _qkv(3)[0]
    pos = torch.arange(12)
    mask = attention_mask(pos, pos, causal=True)
    assert mask is not None
    scale = 8**-0.5
    probs = torch.softmax((q @ k.transpose(-2, -1) * scale).masked_fill(~mask, float("-inf")), -1)
    out = probs @ v
    out.backward(dout)
    with torch.no_grad():
        lse = torch.logsumexp((q @ k.transpose(-2, -1) * scale).masked_fill(~mask, float("-inf")), -1)
        delta = (dout * out).sum(-1)
        dq = torch.zeros_like(q)
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        for keys in (slice(0, 5), slice(5, 12)):
            g_q, g_k, g_v = block_grads(q, k[..., keys, :], v[..., keys, :], dout, delta, lse,
                                        scale, mask[..., keys])
            dq += g_q
            dk[..., keys, :] += g_k
            dv[..., keys, :] += g_v
    for got, want in ((dq, q.grad), (dk, k.grad), (dv, v.grad)):
        assert want is not None and (got - want).abs().max() < 1e-13


def test_document_masks_keep_attention_inside_a_document_causal_within_it() -> None:
    pos = torch.arange(5)
    docs = torch.tensor([0, 0, 1, 1, 1])
    mask = attention_mask(pos, pos, causal=True, q_doc=docs, k_doc=docs)
    assert mask is not None
    assert mask[0, 0].int().tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0],
                                         [0, 0, 1, 1, 0], [0, 0, 1, 1, 1]]
    per_row = attention_mask(pos, pos, causal=False, q_doc=docs[None].repeat(2, 1),
                             k_doc=docs[None].repeat(2, 1))
    assert per_row is not None and per_row.shape == (2, 1, 5, 5)
    assert attention_mask(pos, pos, causal=False) is None


def test_shard_positions_follow_the_chunk_map_and_unshard_inverts_shard() -> None:
    assert shard_positions(16, 0, 2).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert shard_positions(16, 1, 2).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert shard_positions(16, 1, 2, zigzag=False).tolist() == list(range(8, 16))
    x = torch.arange(2 * 24).reshape(2, 24, 1).float()
    for zigzag in (True, False):
        parts = [shard(x, r, 3, zigzag=zigzag) for r in range(3)]
        assert torch.equal(unshard(parts, zigzag=zigzag), x)
    with pytest.raises(ValueError, match=r"seq_len \(10\) must be a multiple of 2 x cp \(4\)"):
        shard_positions(10, 0, 2)
