"""Microbatches flowing through pipeline stages, replayed from a recorded run.

What this teaches: the same picture as the timeline, but in time order -- at each frame the
boxes of every F / B that has started so far are drawn (growing while they run), a cursor
marks "now", and each rank's label says which action it is running or that it is idle (in
the bubble). Built from the run's own ``Timeline``, never from the plan, so the student sees
what their ranks actually did.

``pipeline_animation`` returns a matplotlib ``FuncAnimation``; ``pipeline_animation_html``
its self-contained JavaScript player (``to_jshtml``) for a notebook cell.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from labkit.analysis.plots import COLORS, _units
from labkit.strategies.pipeline.metrics import actions_of

if TYPE_CHECKING:
    from matplotlib.animation import FuncAnimation

    from labkit.analysis.timeline import Timeline


def pipeline_animation(timeline: Timeline, step: int | None = None, frames: int = 40,
                       interval_ms: int = 120) -> FuncAnimation:
    """Animate one step (default: the last) of a recorded pipeline run."""
    import matplotlib.pyplot as plt
    from matplotlib.animation import FuncAnimation

    acts = actions_of(timeline.events)
    steps = sorted({e.step for e in acts if e.step is not None})
    chosen = step if step is not None else (steps[-1] if steps else None)
    acts = sorted((e for e in acts if e.step == chosen), key=lambda e: e.start_ns)
    ranks = timeline.ranks
    t0 = min((e.start_ns for e in acts), default=0)
    t1 = max((e.end_ns for e in acts), default=1)
    scale, unit = _units(t1 - t0)
    fig, ax = plt.subplots(figsize=(9, 0.9 + 0.7 * len(ranks)))
    ax.set_xlim(0, (t1 - t0) / scale)
    ax.set_ylim(len(ranks), 0)
    ax.set_yticks([r + 0.5 for r in ranks])
    ax.set_yticklabels([f"rank {r}" for r in ranks])
    ax.set_xlabel(f"time ({unit}), measured")
    ax.set_title(f"microbatches flowing through the stages, step {chosen}")
    cursor = ax.axvline(0, color="#333", linewidth=1)
    status = [ax.text(1.01, r + 0.5, "", transform=ax.get_yaxis_transform(), va="center",
                      fontsize=8) for r in ranks]
    bars: list[Any] = []
    plt.close(fig)

    def draw(frame: int) -> list[Any]:
        now = t0 + (t1 - t0) * frame / max(frames - 1, 1)
        for b in bars:
            b.remove()
        bars.clear()
        running = {r: "idle (bubble)" for r in ranks}
        for e in acts:
            if e.start_ns > now:
                break
            end = min(e.end_ns, now)
            x, w = (e.start_ns - t0) / scale, max((end - e.start_ns) / scale, 1e-9)
            bars.append(ax.broken_barh([(x, w)], (e.rank + 0.1, 0.8), facecolors=COLORS[e.op],
                                       edgecolor="white"))
            if e.end_ns >= now:
                running[e.rank] = f"running {e.name}"
            if w > (t1 - t0) / scale / 40:
                bars.append(ax.text(x + w / 2, e.rank + 0.5, e.name or "", ha="center",
                                    va="center", fontsize=7, clip_on=True))
        cursor.set_xdata([(now - t0) / scale] * 2)
        for r, text in zip(ranks, status):
            text.set_text(running[r])
        return [cursor, *status, *bars]

    return FuncAnimation(fig, draw, frames=frames, interval=interval_ms, blit=False)


def pipeline_animation_html(timeline: Timeline, step: int | None = None,
                            frames: int = 40) -> str:
    """The animation as a self-contained HTML/JavaScript player (``IPython.display.HTML``)."""
    from labkit.visuals.player import jshtml

    return jshtml(pipeline_animation(timeline, step, frames), "the pipeline")
