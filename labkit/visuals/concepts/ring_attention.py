"""Ring attention before any run: who holds which tokens, and whose keys each rank uses when.

Teaches the picture behind lesson 14's context parallelism (Liu et al. 2023, "Ring Attention
with Blockwise Transformers"; the zig-zag layout of Megatron-LM's context parallelism and
zhuzilin/ring-flash-attention). The sequence is cut into ``2 cp`` chunks:

* **left**: the chunks coloured by the rank that holds them, plain (rank i: chunks 2i, 2i+1)
  and zig-zag (rank i: chunks i and 2cp-1-i);
* **right**: the ring's schedule, a row per rank and a column per ring step: the cell names
  whose key/value block the rank holds at that step (``(r - t) mod cp``, passed on to
  r+1 while it computes) and how many of its 4 chunk blocks causal attention computes there,
  plain / zig-zag (``labkit.theory.context.blocks_per_step``).

Returns a matplotlib ``Figure``; never calls ``plt.show()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from labkit.analysis.plots import new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

RANK_COLORS = ("#4C9BE8", "#F28E2B", "#59A14F", "#B07AA1", "#E15759", "#76B7B2", "#EDC948",
               "#9C755F")


def plot_ring_attention(cp: int = 4) -> Figure:
    """The zig-zag layout and the ring's schedule for ``cp`` ranks (2 to 8)."""
    from matplotlib.patches import Rectangle

    from labkit.theory.context import blocks_per_step, chunk_owner

    if not 2 <= cp <= len(RANK_COLORS):
        raise ValueError(f"cp ({cp}) must be 2..{len(RANK_COLORS)} to draw; e.g. cp=4")
    fig = new_figure((10, 1.2 + 0.55 * cp))
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for row, (name, zz) in enumerate((("zig-zag", True), ("plain", False))):
        for c in range(2 * cp):
            owner = chunk_owner(c, cp, zigzag=zz)
            left.add_patch(Rectangle((c, row), 0.95, 0.8, color=RANK_COLORS[owner]))
            left.text(c + 0.47, row + 0.4, str(owner), ha="center", va="center", fontsize=8)
        left.text(-0.2, row + 0.4, name, ha="right", va="center", fontsize=9)
    left.set_xlim(-2.2, 2 * cp)
    left.set_ylim(-0.4, 2.2)
    left.set_title(f"the sequence in {2 * cp} chunks: which rank holds each", fontsize=9)
    left.set_xlabel("chunk (position order) ->", fontsize=8)
    left.set_xticks([])
    left.set_yticks([])
    plain = [blocks_per_step(r, cp, zigzag=False) for r in range(cp)]
    zig = [blocks_per_step(r, cp, zigzag=True) for r in range(cp)]
    for r in range(cp):
        for t in range(cp):
            held = (r - t) % cp
            y = cp - 1 - r
            right.add_patch(Rectangle((t, y), 0.95, 0.9, color=RANK_COLORS[held], alpha=0.6))
            right.text(t + 0.47, y + 0.45, f"kv{held}\n{plain[r][t]} / {zig[r][t]}",
                       ha="center", va="center", fontsize=7)
    right.set_xlim(0, cp)
    right.set_ylim(0, cp)
    right.set_xticks([t + 0.47 for t in range(cp)], [str(t) for t in range(cp)])
    right.set_yticks([cp - 1 - r + 0.45 for r in range(cp)], [f"rank {r}" for r in range(cp)])
    right.set_xlabel("ring step (kv block sent to rank r+1 while computing)", fontsize=8)
    right.set_title("blocks computed (causal): plain / zig-zag", fontsize=9)
    fig.tight_layout()
    return fig
