"""The ring all-reduce of a REAL run, drawn step by step and animated chunk by chunk.

Input is a ``labkit.launch(record_ring, n, numel)`` result: what every rank held after each
ring step (``labkit.strategies.collectives.ring.record_ring``) and the run's trace. The
chunks on the wire come from the trace itself: every traced ``send`` span (named ``RS<s>`` or
``AG<s>`` by the ring, with its chunk, peer and bytes) is one chunk travelling from a rank to
its right neighbour. Nothing is invented: each frame is what the ranks held and sent.

Ranks sit on a circle. In each ring step the chunks leave their rank as coloured boxes
carrying their values, travel along the arc to the right neighbour and arrive; the receiver
*adds* them in the reduce-scatter and *copies* them in the all-gather. Every rank keeps a
count of the bytes it sent, and the title sets it against the prediction, 2(n-1)/n x the
tensor's bytes (Patarasuk and Yuan 2009). The animation is a matplotlib ``FuncAnimation``
rendered with ``to_jshtml`` so it plays in a saved notebook without a live kernel.
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
PHASES = {"RS": "reduce-scatter", "AG": "all-gather"}
FIGSIZE = (7.0, 5.0)
ANIMATION_DPI = 85  # every frame is an embedded PNG: readable, and the notebook stays small


def traced_transfers(timeline: Any) -> list[dict[str, Any]]:
    """Every ring chunk on the wire, read from the trace: one per traced ``send`` span."""
    from labkit.base.events import Op

    out = []
    for e in timeline.select(op=Op.SEND):
        if e.name is None or e.name[:2] not in PHASES or e.peer is None:
            continue
        out.append({"phase": PHASES[e.name[:2]], "step": int(e.name[2:]), "src": e.rank,
                    "dst": e.peer, "chunk": e.chunk, "bytes": e.bytes or 0,
                    "start_ns": e.start_ns, "end_ns": e.end_ns})
    return out


def ring_record(run: Any, timeline: Any = None) -> dict[str, Any]:
    """Merge one recorded ring all-reduce into one record.

    ``run`` is the ``LaunchResult`` of ``labkit.launch(record_ring, n, numel)`` (the chunks
    on the wire are then read from its trace), or the list of the ranks' recordings (with
    ``timeline``, or else the chunks each rank noted itself).
    """
    results = run.results if hasattr(run, "results") else run
    timeline = run.timeline if timeline is None and hasattr(run, "timeline") else timeline
    ranks = sorted(results, key=lambda r: r["rank"])
    stages = {len(r["values"]) for r in ranks}
    if len(stages) != 1 or not ranks[0]["values"]:
        raise ValueError("every rank must have recorded values for every stage; record a small "
                         "tensor (<= 64 elements), e.g. labkit.launch(record_ring, 3, 6)")
    n = len(ranks)
    traced = timeline is not None
    transfers = traced_transfers(timeline) if traced else [t for r in ranks
                                                           for t in r["transfers"]]
    by_stage: list[list[dict[str, Any]]] = [[] for _ in range(2 * (n - 1))]
    for t in transfers:
        by_stage[t["step"] + (0 if t["phase"] == "reduce-scatter" else n - 1)].append(t)
    for group in by_stage:
        group.sort(key=lambda t: t["src"])
    sent = [[0] * n]  # bytes each rank has sent after every stage
    for group in by_stage:
        row = list(sent[-1])
        for t in group:
            row[t["src"]] += t["bytes"]
        sent.append(row)
    numel = len(ranks[0]["start"])
    item = next((t["bytes"] // max(1, b - a) for t in transfers
                 for a, b in [ranks[0]["bounds"][t["chunk"]]] if b > a), 4)
    return {"world_size": n, "bounds": ranks[0]["bounds"], "traced": traced,
            "values": [r["values"] for r in ranks], "transfers": by_stage,
            "start": [r["start"] for r in ranks], "result": [r["result"] for r in ranks],
            "expected": [sum(col) for col in zip(*(r["start"] for r in ranks))],
            "bytes_sent": sent, "tensor_bytes": numel * item,
            "predicted_bytes_per_rank": 2 * (n - 1) / n * numel * item}


def stage_title(record: dict[str, Any], stage: int) -> str:
    n = record["world_size"]
    if stage == 0:
        return "start: every rank holds its own gradient"
    k = stage - 1
    if k < n - 1:
        return f"reduce-scatter step {k + 1}/{n - 1}: send a chunk right, ADD the one received"
    return f"all-gather step {k - n + 2}/{n - 1}: pass finished chunks on, COPY the one received"


def _positions(n: int) -> list[tuple[float, float]]:
    return [(math.cos(math.pi / 2 - 2 * math.pi * r / n),
             math.sin(math.pi / 2 - 2 * math.pi * r / n)) for r in range(n)]


ARC = "arc3,rad=-0.3"
"""The wire between neighbours: an arc bulging outward, along the ring."""


def _arc_point(p0: tuple[float, float], p2: tuple[float, float], t: float,
               rad: float = -0.3) -> tuple[float, float]:
    """Point ``t`` of the way along matplotlib's ``arc3,rad`` curve from p0 to p2."""
    (x0, y0), (x2, y2) = p0, p2
    cx, cy = (x0 + x2) / 2 + rad * (y2 - y0), (y0 + y2) / 2 - rad * (x2 - x0)
    return ((1 - t) ** 2 * x0 + 2 * (1 - t) * t * cx + t ** 2 * x2,
            (1 - t) ** 2 * y0 + 2 * (1 - t) * t * cy + t ** 2 * y2)


def _chunk_text(chunk: list[float]) -> str:
    return ", ".join(f"{v:g}" for v in chunk) if len(chunk) <= 2 else f"Σ{sum(chunk):g}"


def draw_ring_state(ax: Axes, record: dict[str, Any], stage: int,
                    travel: float | None = None) -> None:
    """Draw the ranks on a circle after ``stage`` (0 = before step 1).

    ``travel`` in (0, 1): the chunks of ``stage`` are that far along the wire (the ranks
    still hold what they held before it); None: they have arrived (arrows show their path).
    """
    ax.clear()
    n = record["world_size"]
    bounds = record["bounds"]
    pos = _positions(n)
    moving = stage > 0 and travel is not None
    held = stage - 1 if moving else stage
    sent = record["transfers"][stage - 1] if stage > 0 else []
    for t in sent:
        a, b = _arc_point(pos[t["src"]], pos[t["dst"]], 0.2), \
            _arc_point(pos[t["src"]], pos[t["dst"]], 0.8)
        if not moving:
            ax.annotate("", xy=b, xytext=a,
                        arrowprops={"arrowstyle": "-|>", "color": PHASE_COLORS[t["phase"]],
                                    "lw": 2, "connectionstyle": ARC})
            continue
        x, y = _arc_point(pos[t["src"]], pos[t["dst"]], 0.2 + 0.6 * float(travel or 0.0))
        lo, hi = bounds[t["chunk"]]
        carried = record["values"][t["src"]][stage - 1][lo:hi]
        ax.text(x, y, f"c{t['chunk']}: {_chunk_text(carried)}\n{t['bytes']} B", ha="center",
                va="center", fontsize=9, color="white", fontweight="bold", zorder=5,
                bbox={"boxstyle": "round", "fc": CHUNK_COLORS[t["chunk"] % len(CHUNK_COLORS)],
                      "ec": PHASE_COLORS[t["phase"]], "lw": 2})
    # bytes counted from departure: a chunk on the wire has been sent
    counted = record["bytes_sent"][stage] if "bytes_sent" in record else None
    for r, (x, y) in enumerate(pos):
        vals = record["values"][r][held]
        lines = []
        for c, (a, b) in enumerate(bounds):
            chunk = vals[a:b]
            done = bool(chunk) and chunk == record["expected"][a:b]
            lines.append(f"c{c}: {_chunk_text(chunk)}{' ✓' if done else ''}")
        if counted is not None:
            lines.append(f"sent {counted[r]} B")
        ax.text(x, y, f"rank {r}\n" + "\n".join(lines), ha="center", va="center",
                fontsize=9, family="monospace",
                bbox={"boxstyle": "round", "fc": "#F7F7F7", "ec": "#888"})
    ax.set_xlim(-1.6, 1.6)
    ax.set_ylim(min(y for _, y in pos) - 0.5, max(y for _, y in pos) + 0.4)
    ax.set_aspect("equal")
    ax.axis("off")
    title = stage_title(record, stage)
    if counted is not None:
        source = "traced sends" if record.get("traced") else "sends"
        so_far = (f"up to {max(counted)} B per rank so far" if max(counted)
                  else "nothing sent yet")
        title += (f"\n{source}: {so_far}; predicted in all: 2(n-1)/n x "
                  f"{record['tensor_bytes']} B = {record['predicted_bytes_per_rank']:.1f} B")
    ax.set_title(title, fontsize=9)


def plot_ring_state(record: dict[str, Any], stage: int = 0) -> Figure:
    """One frame: the ranks' chunks after ``stage`` of ``2(n-1)`` ring steps (✓ = final sum)."""
    import matplotlib.pyplot as plt

    stages = len(record["values"][0])
    if not 0 <= stage < stages:
        raise ValueError(f"stage ({stage}) must be in 0..{stages - 1} for this record")
    fig, ax = plt.subplots(figsize=FIGSIZE)
    draw_ring_state(ax, record, stage)
    plt.close(fig)
    return fig


def ring_frames(record: dict[str, Any], travel_frames: int = 3) -> list[tuple[int, float | None]]:
    """(stage, travel) of every frame: the start, then per ring step the chunks in flight
    (``travel_frames - 1`` positions) and their arrival."""
    frames: list[tuple[int, float | None]] = [(0, None)]
    for stage in range(1, len(record["values"][0])):
        frames += [(stage, f / travel_frames) for f in range(1, travel_frames)]
        frames.append((stage, None))
    return frames


def ring_animation(record: dict[str, Any], interval_ms: int = 350,
                   travel_frames: int = 3) -> FuncAnimation:
    """A ``FuncAnimation`` moving every chunk of the recorded all-reduce along the ring."""
    import matplotlib.pyplot as plt
    from matplotlib.animation import FuncAnimation

    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=ANIMATION_DPI)
    frames = ring_frames(record, travel_frames)
    anim = FuncAnimation(fig, lambda k: draw_ring_state(ax, record, *frames[k]),
                         frames=len(frames), interval=interval_ms, repeat=True)
    plt.close(fig)
    return anim


def ring_animation_html(record: dict[str, Any], interval_ms: int = 350,
                        travel_frames: int = 3) -> str:
    """The animation as self-contained HTML (``to_jshtml``): plays without a live kernel."""
    return ring_animation(record, interval_ms, travel_frames).to_jshtml(default_mode="once")
