"""Lesson 14's ring-attention animation draws what the trace's rows say: the block each rank
attends to, the blocks on their way to the next rank, and the bytes sent so far."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest

from labkit.visuals.ring_attention_anim import (
    plot_ring_attention_step,
    ring_attention_animation_html,
    ring_attention_frames,
)


def _rows(cp: int = 3, nbytes: int = 512) -> list[dict]:
    """What ``long_sequences.ring_steps`` reads off a ring of ``cp`` ranks: at step t rank r
    attends to rank (r - t) mod cp's block and sends it on, except at the last step."""
    return [{"ring step": t, "rank": r, "computes with": f"kv{(r - t) % cp}",
             "sends on (bytes)": nbytes if t < cp - 1 else 0,
             "send posted first": "yes" if t < cp - 1 else "-"}
            for t in range(cp) for r in range(cp)]


def _texts(fig) -> dict[str, str]:
    return {t.get_gid(): t.get_text() for ax in fig.axes for t in ax.texts if t.get_gid()}


def test_each_rank_shows_the_block_it_attends_to_and_the_block_it_passes_on() -> None:
    fig = plot_ring_attention_step(_rows(), step=1)
    texts = _texts(fig)
    assert texts["rank0"].endswith("Q 0 x KV 2") and texts["rank1"].endswith("Q 1 x KV 0")
    assert {g for g in texts if g.startswith("block")} == {"block0", "block1", "block2"}
    bars = [p.get_height() for p in fig.axes[1].patches]
    assert bars == pytest.approx([0.512] * 3)  # step 0 sent, step 1's blocks not yet left
    assert "ring step 2 of 3" in fig._suptitle.get_text()


def test_the_last_step_passes_nothing_on_and_the_frames_say_so() -> None:
    rows = _rows()
    last = plot_ring_attention_step(rows, step=2)
    assert not [g for g in _texts(last) if g.startswith("block")]
    assert "nothing left to pass on" in last._suptitle.get_text()
    frames = ring_attention_frames(rows, travel_frames=4)
    assert frames[0] == (0, None) and frames[-1] == (2, None)
    assert [f for f in frames if f[0] == 2] == [(2, None)]
    assert len(frames) == 2 * 4 + 1


def test_the_animation_plays_without_a_kernel_and_refuses_an_empty_trace() -> None:
    assert "<script" in ring_attention_animation_html(_rows(2), travel_frames=2)
    with pytest.raises(ValueError, match="attn kv"):
        ring_attention_animation_html([])
