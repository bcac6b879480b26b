"""The ring all-reduce of a REAL run, drawn step by step and animated.

Input is the recording ``labkit.strategies.collectives.ring.record_ring`` returns on every
rank (merged by ``ring_record``): each rank's tensor after every ring step and every chunk
it sent. Nothing is invented: each frame is what the ranks held at that moment. Ranks sit on
a circle; each shows its chunks (value sums when a chunk holds several numbers); the arrows
are the chunks on the wire in that step, reduce-scatter (adding) then all-gather (copying).
The animation is a matplotlib ``FuncAnimation`` rendered with ``to_jshtml`` so it plays in
a saved notebook without a live kernel.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.animation import FuncAnimation
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PHASE_COLORS = {"reduce-scatter": "#E15759", "all-gather": "#4C9BE8"}
CHUNK_COLORS = ("#F28E2B", "#59A14F", "#B07AA1", "#76B7B2", "#EDC948", "#9C755F")


def ring_record(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Merge the per-rank recordings of one ring all-reduce into one record (by rank)."""
    ranks = sorted(results, key=lambda r: r["rank"])
    stages = {len(r["values"]) for r in ranks}
    if len(stages) != 1 or not ranks[0]["values"]:
        raise ValueError("every rank must have recorded values for every stage; record a small "
                         "tensor (<= 64 elements), e.g. labkit.launch(record_ring, 3, 6)")
    n = len(ranks)
    transfers = [t for r in ranks for t in r["transfers"]]
    by_stage: list[list[dict[str, Any]]] = [[] for _ in range(2 * (n - 1))]
    for t in transfers:
        k = t["step"] + (0 if t["phase"] == "reduce-scatter" else n - 1)
        by_stage[k].append(t)
    return {"world_size": n, "bounds": ranks[0]["bounds"],
            "values": [r["values"] for r in ranks], "transfers": by_stage,
            "start": [r["start"] for r in ranks], "result": [r["result"] for r in ranks],
            "expected": [sum(col) for col in zip(*(r["start"] for r in ranks))]}


def stage_title(record: dict[str, Any], stage: int) -> str:
    n = record["world_size"]
    if stage == 0:
        return "start: every rank holds its own gradient"
    k = stage - 1
    if k < n - 1:
        return f"reduce-scatter step {k + 1}/{n - 1}: send a chunk right, ADD the one received"
    return f"all-gather step {k - n + 2}/{n - 1}: pass finished chunks on, COPY the one received"


def draw_ring_state(ax: Axes, record: dict[str, Any], stage: int) -> None:
    """Draw ranks on a circle with their chunk values after ``stage`` (0 = before step 1)."""
    ax.clear()
    n = record["world_size"]
    bounds = record["bounds"]
    pos = [(math.cos(math.pi / 2 - 2 * math.pi * r / n), math.sin(math.pi / 2 - 2 * math.pi * r / n))
           for r in range(n)]
    sent = record["transfers"][stage - 1] if stage > 0 else []
    for t in sent:
        (x0, y0), (x1, y1) = pos[t["src"]], pos[t["dst"]]
        ax.annotate("", xy=(x0 + 0.8 * (x1 - x0), y0 + 0.8 * (y1 - y0)),
                    xytext=(x0 + 0.2 * (x1 - x0), y0 + 0.2 * (y1 - y0)),
                    arrowprops={"arrowstyle": "-|>", "color": PHASE_COLORS[t["phase"]],
                                "lw": 2, "connectionstyle": "arc3,rad=0.25"})
        ax.text((x0 + x1) / 2 * 0.55, (y0 + y1) / 2 * 0.55, f"chunk {t['chunk']}",
                ha="center", va="center", fontsize=7, color=PHASE_COLORS[t["phase"]])
    for r, (x, y) in enumerate(pos):
        vals = record["values"][r][stage]
        lines = []
        for c, (a, b) in enumerate(bounds):
            chunk = vals[a:b]
            done = bool(chunk) and chunk == record["expected"][a:b]
            text = ", ".join(f"{v:g}" for v in chunk) if len(chunk) <= 2 else f"Σ{sum(chunk):g}"
            lines.append(f"c{c}: {text}{' ✓' if done else ''}")
        ax.text(x * 1.05, y * 1.05, f"rank {r}\n" + "\n".join(lines), ha="center", va="center",
                fontsize=8, family="monospace",
                bbox={"boxstyle": "round", "fc": "#F7F7F7", "ec": "#888"})
    ax.set_xlim(-1.9, 1.9)
    ax.set_ylim(-1.7, 1.7)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(stage_title(record, stage), fontsize=10)


def plot_ring_state(record: dict[str, Any], stage: int = 0) -> Figure:
    """One frame: the ranks' chunks after ``stage`` of ``2(n-1)`` ring steps (✓ = final sum)."""
    import matplotlib.pyplot as plt

    stages = len(record["values"][0])
    if not 0 <= stage < stages:
        raise ValueError(f"stage ({stage}) must be in 0..{stages - 1} for this record")
    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    draw_ring_state(ax, record, stage)
    plt.close(fig)
    return fig


def ring_animation(record: dict[str, Any], interval_ms: int = 1200) -> FuncAnimation:
    """A ``FuncAnimation`` stepping through every stage of the recorded all-reduce."""
    import matplotlib.pyplot as plt
    from matplotlib.animation import FuncAnimation

    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    frames = len(record["values"][0])
    anim = FuncAnimation(fig, lambda k: draw_ring_state(ax, record, k), frames=frames,
                         interval=interval_ms, repeat=True)
    plt.close(fig)
    return anim


def ring_animation_html(record: dict[str, Any], interval_ms: int = 1200) -> str:
    """The animation as self-contained HTML (``to_jshtml``): plays without a live kernel."""
    return ring_animation(record, interval_ms).to_jshtml(default_mode="once")
