"""Ring attention of a REAL run, animated ring step by ring step from its trace.

Input is the rows ``labkit.lessons.long_sequences.ring_steps`` reads off a ring-attention
run's timeline: at every ring step, whose key/value block each rank computed with (its
``attn kvJ`` span) and the K/V bytes it sent on to the next rank (its traced ``send``), and
whether that send was posted before the compute began. Nothing is invented: each frame is
what the ranks did at that step.

Ranks sit on a ring (rank 0 at the top, clockwise, as in lesson 01's ring all-reduce). Each
rank keeps its own queries ``Q r`` for the whole forward; at ring step ``t`` it attends to the
K/V block it holds -- rank ``(r - t) mod cp``'s -- and meanwhile passes that block on to rank
``r + 1`` (Liu et al. 2023, "Ring Attention with Blockwise Transformers"): the blocks glide
along the ring while the ranks compute, so the send hides under the block's attention when
one block's compute lasts longer than one block's transfer. A bar per rank counts the K/V
bytes it has sent so far. Rendered with ``to_jshtml``, so it plays in a saved notebook.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from labkit.visuals.ring_anim import ANIMATION_DPI, CHUNK_COLORS, _at

if TYPE_CHECKING:
    from matplotlib.animation import FuncAnimation
    from matplotlib.figure import Figure

FIGSIZE = (10.0, 5.2)
COMPUTE = "#CFE8CC"
"""A rank attending to the block it holds."""


def _block(name: str) -> int:
    """``kv3`` -> 3: the rank whose keys and values the block holds."""
    return int("".join(ch for ch in name if ch.isdigit()) or 0)


def steps_of(rows: Sequence[dict[str, Any]]) -> list[dict[int, dict[str, Any]]]:
    """The rows grouped by ring step, each a map rank -> its row (missing ranks absent)."""
    out: dict[int, dict[int, dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(int(row["ring step"]), {})[int(row["rank"])] = row
    return [out[s] for s in sorted(out)]


def ring_attention_frames(rows: Sequence[dict[str, Any]],
                          travel_frames: int = 4) -> list[tuple[int, float | None]]:
    """(ring step, travel) of every frame: per step the blocks at their ranks, then on their
    way to the next rank (``travel_frames - 1`` positions; a step that sends nothing, the
    ring's last, has none)."""
    frames: list[tuple[int, float | None]] = []
    for t, ranks in enumerate(steps_of(rows)):
        frames.append((t, None))
        if any(r["sends on (bytes)"] for r in ranks.values()):
            frames += [(t, f / travel_frames) for f in range(1, travel_frames)]
    return frames


class RingAttentionFigure:
    """One figure, redrawn per frame: the ring on the left, the bytes sent on the right."""

    def __init__(self, fig: Figure, rows: Sequence[dict[str, Any]]):
        self.fig, self.steps = fig, steps_of(rows)
        self.cp = 1 + max(int(r["rank"]) for r in rows)
        self.ring_ax = fig.add_axes((0.0, 0.02, 0.58, 0.86))
        self.bar_ax = fig.add_axes((0.66, 0.16, 0.31, 0.62))

    def sent_until(self, step: int, travel: float | None) -> list[int]:
        """Bytes each rank has sent: every finished step, plus this one once it is on its way."""
        out = [0] * self.cp
        for t, ranks in enumerate(self.steps):
            if t < step or (t == step and travel is not None):
                for r, row in ranks.items():
                    out[r] += int(row["sends on (bytes)"])
        return out

    def draw(self, step: int, travel: float | None) -> None:
        from matplotlib.patches import Circle

        ax, n, ranks = self.ring_ax, self.cp, self.steps[step]
        ax.clear()
        ax.set_xlim(-1.95, 1.95)
        ax.set_ylim(-1.7, 1.7)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.add_patch(Circle((0, 0), 1.0, fill=False, lw=2.0, color="#C8C8C8", zorder=1))
        for r in range(n):  # the way the blocks travel: rank r to rank r + 1
            ax.annotate("", xy=_at(n, r + 0.53), xytext=_at(n, r + 0.47), zorder=2,
                        arrowprops={"arrowstyle": "-|>,head_width=0.45,head_length=0.9",
                                    "color": "#9A9A9A", "lw": 1.5})
        for r in range(n):
            row = ranks.get(r)
            held = _block(row["computes with"]) if row else None
            x, y = _at(n, r, 1.0)
            ax.text(x, y, f"rank {r}\nQ {r}" + (f" x KV {held}" if held is not None else ""),
                    ha="center", va="center", fontsize=10, zorder=4, gid=f"rank{r}",
                    bbox={"boxstyle": "round,pad=0.45", "fc": COMPUTE if row else "white",
                          "ec": "#4A4A4A", "alpha": 0.9 if row else 1.0})
            if row is None or held is None or not row["sends on (bytes)"]:
                continue
            bx, by = _at(n, r + (travel if travel is not None else 0.0), 1.5)
            ax.text(bx, by, f"KV {held}", ha="center", va="center", fontsize=9, zorder=5,
                    color="white", gid=f"block{held}",
                    bbox={"boxstyle": "round,pad=0.3", "fc": CHUNK_COLORS[held % len(CHUNK_COLORS)],
                          "ec": "none"})
        posted = [row["send posted first"] for row in ranks.values()
                  if row["send posted first"] != "-"]
        moving = ("the K/V blocks travel to the next rank while every rank attends"
                  if posted else "the last step: nothing left to pass on")
        first = (f"; sends posted before the compute on {posted.count('yes')} of "
                 f"{len(posted)} ranks" if posted else "")
        self.fig.suptitle(f"ring attention on {n} ranks, ring step {step + 1} of "
                          f"{len(self.steps)}\n{moving}{first}", fontsize=11)
        sent = self.sent_until(step, travel)
        bx_ = self.bar_ax
        bx_.clear()
        bx_.bar(range(n), [b / 1e3 for b in sent], color=CHUNK_COLORS[0], gid="sent")
        bx_.set_xticks(range(n), [f"rank {r}" for r in range(n)])
        total = [0] * n
        for ranks_t in self.steps:
            for r, row in ranks_t.items():
                total[r] += int(row["sends on (bytes)"])
        bx_.set_ylim(0, max(max(total) / 1e3, 1e-3) * 1.15)
        bx_.set_ylabel("K/V sent so far (kB, traced)")
        bx_.set_title(f"of {max(total) / 1e3:.1f} kB per rank in the whole ring", fontsize=10)


def plot_ring_attention_step(rows: Sequence[dict[str, Any]], step: int = 0) -> Figure:
    """One ring step as a still figure (the blocks at their ranks)."""
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=FIGSIZE)
    RingAttentionFigure(fig, rows).draw(step, None)
    return fig


def ring_attention_animation(rows: Sequence[dict[str, Any]], interval_ms: int = 350,
                             travel_frames: int = 4) -> FuncAnimation:
    """A ``FuncAnimation`` of the ring's steps, blocks moving while the ranks compute."""
    import matplotlib.pyplot as plt
    from matplotlib.animation import FuncAnimation

    if not rows:
        raise ValueError("no ring-attention steps to animate: the trace holds no 'attn kv' "
                         "compute spans (run ring attention with tracing on)")
    fig = plt.figure(figsize=FIGSIZE, dpi=ANIMATION_DPI)
    drawn = RingAttentionFigure(fig, rows)
    frames = ring_attention_frames(rows, travel_frames)
    anim = FuncAnimation(fig, lambda k: drawn.draw(*frames[k]), frames=len(frames),
                         interval=interval_ms, repeat=True)
    plt.close(fig)
    return anim


def ring_attention_animation_html(rows: Sequence[dict[str, Any]], interval_ms: int = 350,
                                  travel_frames: int = 4) -> str:
    """The animation as self-contained HTML (``to_jshtml``'s player, its frames counted on a
    bar: ``labkit.visuals.player``): plays without a live kernel."""
    from labkit.visuals.player import jshtml

    return jshtml(ring_attention_animation(rows, interval_ms, travel_frames), "ring attention",
                  "once")
