"""The ring all-reduce of a REAL run, drawn step by step and animated chunk by chunk.

Input is a ``labkit.launch(record_ring, n, numel)`` result: what every rank held after each
ring step (``labkit.strategies.collectives.ring.record_ring``) and the run's trace. The
chunks on the wire come from the trace itself: every traced ``send`` span (named ``RS<s>`` or
``AG<s>`` by the ring, with its chunk, peer and bytes) is one chunk travelling from a rank to
its right neighbour. Nothing is invented: each frame is what the ranks held and sent.

Ranks sit on the ring, drawn in every frame with an arrow per hop showing the direction the
chunks travel (rank r to rank r+1). In each ring step the chunks leave their rank as
coloured boxes carrying their values, glide along the ring to the next rank (``ring_frames``:
four positions and the arrival, so a hop reads as motion, not a jump) and arrive; the
receiver *adds* them in the reduce-scatter and *copies* them in the all-gather. Beside the
ring a key explains the notation (``c0``, ``Σ10``, ``✓``) and a bar per rank counts the bytes
it has sent against the prediction, 2(n-1)/n x the tensor's bytes (Patarasuk and Yuan 2009).
The animation is a matplotlib ``FuncAnimation`` rendered with ``to_jshtml`` so it plays in a
saved notebook without a live kernel.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from labkit.theory.comm import ring_allreduce_bytes, ring_allreduce_steps

if TYPE_CHECKING:
    from matplotlib.animation import FuncAnimation
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PHASE_COLORS = {"reduce-scatter": "#E15759", "all-gather": "#4C9BE8"}
CHUNK_COLORS = ("#F28E2B", "#59A14F", "#B07AA1", "#76B7B2", "#EDC948", "#9C755F")
PHASES = {"RS": "reduce-scatter", "AG": "all-gather"}
FIGSIZE = (10.0, 5.6)
ANIMATION_DPI = 72  # every frame is an embedded PNG: readable, and the notebook stays small


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
    by_stage: list[list[dict[str, Any]]] = [[] for _ in range(ring_allreduce_steps(n))]
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
            "predicted_bytes_per_rank": ring_allreduce_bytes(numel * item, n)}


def stage_title(record: dict[str, Any], stage: int) -> str:
    n = record["world_size"]
    if stage == 0:
        return "start: every rank holds its own gradient"
    k = stage - 1
    if k < n - 1:
        return f"reduce-scatter step {k + 1}/{n - 1}: send a chunk on, ADD the one received"
    return f"all-gather step {k - n + 2}/{n - 1}: pass finished chunks on, COPY the one received"


def _angle(n: int, r: float) -> float:
    """Where rank ``r`` (fractional: between ranks) sits on the ring: rank 0 at the top,
    the ring running clockwise."""
    return math.pi / 2 - 2 * math.pi * r / n


def _at(n: int, r: float, radius: float = 1.0) -> tuple[float, float]:
    a = _angle(n, r)
    return radius * math.cos(a), radius * math.sin(a)


def _chunk_text(chunk: list[float]) -> str:
    return ", ".join(f"{v:g}" for v in chunk) if len(chunk) <= 2 else f"Σ{sum(chunk):g}"


def _draw_ring(ax: Axes, n: int, active: dict[int, str]) -> None:
    """The ring itself and, on every hop, an arrowhead pointing the way chunks travel;
    hops that carry a chunk in this step (``active``: sender -> phase) in the phase's colour."""
    from matplotlib.patches import Circle

    ax.add_patch(Circle((0, 0), 1.0, fill=False, lw=2.0, color="#C8C8C8", zorder=1))
    for r in range(n):  # two heads per hop: a chunk in flight never hides both
        phase = active.get(r)
        color = PHASE_COLORS[phase] if phase else "#9A9A9A"
        for at in (0.33, 0.67):
            ax.annotate("", xy=_at(n, r + at + 0.03), xytext=_at(n, r + at - 0.03), zorder=2,
                        arrowprops={"arrowstyle": "-|>,head_width=0.45,head_length=0.9",
                                    "color": color, "lw": 3.0 if phase else 1.5})


def draw_ring_state(ax: Axes, record: dict[str, Any], stage: int,
                    travel: float | None = None) -> None:
    """Draw the ranks on their ring after ``stage`` (0 = before step 1).

    ``travel`` in (0, 1): the chunks of ``stage`` are that far along the ring (the ranks
    still hold what they held before it); None: they have arrived (their hops coloured).
    """
    ax.clear()
    n = record["world_size"]
    bounds = record["bounds"]
    moving = stage > 0 and travel is not None
    held = stage - 1 if moving else stage
    sent = record["transfers"][stage - 1] if stage > 0 else []
    _draw_ring(ax, n, {t["src"]: t["phase"] for t in sent})
    got = {t["dst"]: t["chunk"] for t in sent} if stage > 0 and not moving else {}
    for t in sent if moving else []:
        # the box glides along the ring from just past the sender to just before the receiver
        x, y = _at(n, t["src"] + 0.3 + 0.4 * float(travel or 0.0))
        lo, hi = bounds[t["chunk"]]
        carried = record["values"][t["src"]][stage - 1][lo:hi]
        ax.text(x, y, f"c{t['chunk']}: {_chunk_text(carried)}\n{t['bytes']} B", ha="center",
                va="center", fontsize=10, color="white", fontweight="bold", zorder=5,
                bbox={"boxstyle": "round", "fc": CHUNK_COLORS[t["chunk"] % len(CHUNK_COLORS)],
                      "ec": PHASE_COLORS[t["phase"]], "lw": 2})
    # bytes counted from departure: a chunk on the wire has been sent
    counted = record["bytes_sent"][stage] if "bytes_sent" in record else None
    for r in range(n):
        vals = record["values"][r][held]
        lines = []
        for c, (a, b) in enumerate(bounds):
            chunk = vals[a:b]
            done = bool(chunk) and chunk == record["expected"][a:b]
            mark = " ←" if got.get(r) == c else ""
            lines.append(f"c{c}: {_chunk_text(chunk)}{' ✓' if done else ''}{mark}")
        if counted is not None:
            lines.append(f"sent {counted[r]} B")
        x, y = _at(n, r)
        ax.text(x, y, f"rank {r}\n" + "\n".join(lines), ha="center", va="center",
                fontsize=10, family="monospace", zorder=4,
                bbox={"boxstyle": "round", "fc": "#F7F7F7", "ec": "#666"})
    ax.set_xlim(-1.55, 1.55)
    ax.set_ylim(-1.45, 1.45)
    ax.set_aspect("equal")
    ax.axis("off")
    title = stage_title(record, stage)
    if counted is not None:
        source = "traced sends" if record.get("traced") else "sends"
        so_far = (f"up to {max(counted)} B per rank so far" if max(counted)
                  else "nothing sent yet")
        title += f"\n{source}: {so_far}"
    ax.set_title(title, fontsize=10)


def _key_text(record: dict[str, Any]) -> str:
    n, bounds = record["world_size"], record["bounds"]
    spans = "\n".join(f"    c{c} = element{'s' if b - a > 1 else ''} {a}"
                      + (f"-{b - 1}" if b - a > 1 else "") for c, (a, b) in enumerate(bounds))
    return ("How to read it\n"
            f"• {n} ranks on a ring: each sends only to the\n"
            "  next one (arrows), receives from the previous\n"
            f"• the tensor is cut into {len(bounds)} chunks:\n{spans}\n"
            "• a chunk of 1-2 numbers shows them;\n"
            "  Σ10: its numbers add up to 10\n"
            "• ✓ the chunk holds the sum over all ranks\n"
            "• ← the chunk this rank just received\n"
            "• red: reduce-scatter, the receiver ADDS\n"
            "• blue: all-gather, the receiver COPIES")


class RingFigure:
    """The ring (left), the key to its notation (top right) and the bytes each rank has
    sent so far against the prediction (bottom right); ``draw`` renders one frame (only the
    ring and the bars' heights change, so a frame is cheap)."""

    def __init__(self, fig: Figure, record: dict[str, Any]):
        grid = fig.add_gridspec(2, 2, width_ratios=(1.2, 1.0), height_ratios=(1.5, 1.0),
                                left=0.01, right=0.97, top=0.9, bottom=0.08, wspace=0.1,
                                hspace=0.25)
        self.record = record
        self.ring = fig.add_subplot(grid[:, 0])
        key = fig.add_subplot(grid[0, 1])
        key.axis("off")
        key.text(0.0, 1.0, _key_text(record), va="top", ha="left", fontsize=9,
                 transform=key.transAxes)
        self.sent = fig.add_subplot(grid[1, 1])
        self.bars: list[Any] = []
        if "bytes_sent" in record:
            self._bars()
        else:
            self.sent.axis("off")

    def _bars(self) -> None:
        ax, record = self.sent, self.record
        n = record["world_size"]
        pred = record["predicted_bytes_per_rank"]
        self.bars = list(ax.bar(range(n), [0] * n, 0.6, color="#8C8C8C"))
        ax.axhline(pred, color="black", ls="--", lw=1,
                   label=f"predicted in all: 2(n-1)/n x {record['tensor_bytes']} B "
                         f"= {pred:.1f} B")
        ax.set_xticks(range(n), [f"rank {r}" for r in range(n)], fontsize=8)
        ax.set_ylim(0, 1.35 * max(pred, max(record["bytes_sent"][-1])))
        ax.set_ylabel("bytes sent so far", fontsize=9)
        ax.tick_params(axis="y", labelsize=8)
        ax.legend(fontsize=8, frameon=False, loc="upper left")

    def draw(self, stage: int, travel: float | None = None) -> None:
        draw_ring_state(self.ring, self.record, stage, travel)
        for bar, b in zip(self.bars, self.record["bytes_sent"][stage] if self.bars else []):
            bar.set_height(b)


def plot_ring_state(record: dict[str, Any], stage: int = 0) -> Figure:
    """One frame: the ranks' chunks after ``stage`` of ``2(n-1)`` ring steps (✓ = final
    sum), the key to the notation and the bytes sent so far."""
    import matplotlib.pyplot as plt

    stages = len(record["values"][0])
    if not 0 <= stage < stages:
        raise ValueError(f"stage ({stage}) must be in 0..{stages - 1} for this record")
    fig = plt.figure(figsize=FIGSIZE)
    RingFigure(fig, record).draw(stage)
    plt.close(fig)
    return fig


def ring_frames(record: dict[str, Any], travel_frames: int = 5) -> list[tuple[int, float | None]]:
    """(stage, travel) of every frame: the start, then per ring step the chunks in flight
    (``travel_frames - 1`` positions along the ring) and their arrival."""
    frames: list[tuple[int, float | None]] = [(0, None)]
    for stage in range(1, len(record["values"][0])):
        frames += [(stage, f / travel_frames) for f in range(1, travel_frames)]
        frames.append((stage, None))
    return frames


def ring_animation(record: dict[str, Any], interval_ms: int = 200,
                   travel_frames: int = 5) -> FuncAnimation:
    """A ``FuncAnimation`` moving every chunk of the recorded all-reduce along the ring."""
    import matplotlib.pyplot as plt
    from matplotlib.animation import FuncAnimation

    fig = plt.figure(figsize=FIGSIZE, dpi=ANIMATION_DPI)
    drawn = RingFigure(fig, record)
    frames = ring_frames(record, travel_frames)
    anim = FuncAnimation(fig, lambda k: drawn.draw(*frames[k]),
                         frames=len(frames), interval=interval_ms, repeat=True)
    plt.close(fig)
    return anim


def ring_animation_html(record: dict[str, Any], interval_ms: int = 200,
                        travel_frames: int = 5) -> str:
    """The animation as self-contained HTML (``to_jshtml``'s player, its frames counted on a
    bar: ``labkit.visuals.player``): plays without a live kernel."""
    from labkit.visuals.player import jshtml

    return jshtml(ring_animation(record, interval_ms, travel_frames), "the ring", "once")
