"""One real data-parallel step, replayed from its trace: seed 001's "Train Step" visualizer.

Input: the ``Timeline`` of a hand-written DDP run (``ddp-bucketed`` or ``ddp-naive``) and
the records its ranks keep of their last step (``RankOutput.extra["train_step"]``:
loss, gradient norms before and after the all-reduce, update size, parameter hash).
Nothing is invented: every bar is a span a rank recorded, at the time it recorded it.

``step_story`` cuts the step into the five phases of the seed's picture, from the events:

1. forward: each rank runs the same model on its own shard;
2. backward: gradients appear last layer first; a bucket's all-reduce starts the moment
   the bucket is full, while backward still runs (PyTorch DDP's overlap, Li et al. 2020);
3. all-reduce: the last buckets finish; every rank now holds the averaged gradient;
4. update: the same averaged gradient, the same optimizer step on every rank;
5. the replicas are equal again: every rank's parameter hash is the same.

``train_step_svg`` draws the step as an SVG whose CSS animations replay it: bars grow as
the playhead passes them (x is real time), each bucket travels to the wire and back while
its all-reduce is in flight, and a caption names the phase. Short phases (the update takes
a fraction of a millisecond) are played slower so they can be read: the playhead's speed
changes, the positions never do. Pure text out: the widget in ``labkit.widgets.dp`` shows it.
"""

from __future__ import annotations

import html
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from labkit.analysis.plots import COLORS
from labkit.analysis.timeline import Timeline
from labkit.base.events import Op

DRAWN = (Op.FORWARD, Op.BACKWARD, Op.OPTIMIZER, Op.ALL_REDUCE, Op.WAIT)
CAPTIONS = (
    "1. forward: each rank runs the same model on its own shard of the batch",
    "2. backward: gradients appear last layer first; a full bucket starts its all-reduce "
    "at once, while backward goes on",
    "3. all-reduce: the last buckets finish; every rank now holds the averaged gradient",
    "4. update: the same averaged gradient, the same optimizer step on every rank",
    "5. the replicas are equal again",
)
# layout of the SVG, in px: a compute row per rank, under it one row per bucket, tall
# enough for the bucket's travelling label (labels of different buckets never overlap)
_W, _X0, _X1, _TOP, _ROW, _SUB = 920, 86, 900, 48, 18, 16


@dataclass(frozen=True)
class Span:
    """One recorded span of the step, in ns since the step began."""

    rank: int
    op: Op
    start: int
    end: int
    bucket: int | None = None
    bytes: int | None = None


@dataclass
class StepStory:
    """A step's spans, its phase boundaries and the ranks' own numbers."""

    step: int
    world_size: int
    duration_ns: int
    spans: list[Span]
    phases: list[tuple[str, int, int]]
    """(caption, start ns, end ns) in order; the last one lasts to the end."""
    records: list[Mapping[str, Any]]

    @property
    def buckets(self) -> list[int]:
        """The all-reduce messages of the step (bucket ids, 0 = the first launched)."""
        return sorted({s.bucket if s.bucket is not None else -1 for s in self.spans
                       if s.op == Op.ALL_REDUCE})

    @property
    def replicas_equal(self) -> bool:
        hashes = {r.get("params_sha256") for r in self.records}
        return len(hashes) == 1 and None not in hashes


def step_story(timeline: Timeline, records: Sequence[Mapping[str, Any]],
               step: int | None = None) -> StepStory:
    """The spans of ``step`` (default: the step the records describe), cut into phases."""
    recs = sorted(records, key=lambda r: r["rank"])
    step = int(recs[0]["step"]) if step is None else step
    events = [e for e in timeline.select(step=step) if e.op in DRAWN or e.op == Op.STEP]
    if not events:
        raise ValueError(f"the timeline has no events of step {step}; run with trace=True")
    t0 = min(e.start_ns for e in events)
    t1 = max(e.end_ns for e in events)
    spans = [Span(e.rank, e.op, e.start_ns - t0, e.end_ns - t0, e.bucket, e.bytes)
             for e in events if e.op in DRAWN]

    def edge(op: Op, pick: Callable[[list[int]], int], attr: str, default: int) -> int:
        values = [getattr(s, attr) for s in spans if s.op == op]
        return pick(values) if values else default

    end = t1 - t0
    cuts = [0, edge(Op.BACKWARD, min, "start", 0), edge(Op.BACKWARD, max, "end", 0),
            edge(Op.OPTIMIZER, min, "start", end), edge(Op.OPTIMIZER, max, "end", end), end]
    for i in range(1, len(cuts)):  # phases follow each other even where ranks overlap
        cuts[i] = min(max(cuts[i], cuts[i - 1]), end)
    phases = [(CAPTIONS[i], cuts[i], cuts[i + 1]) for i in range(4)]
    phases.append((CAPTIONS[4], cuts[4], end))
    return StepStory(step, timeline.world_size, end, spans, phases, list(recs))


def play_clock(story: StepStory, duration_s: float, min_phase_s: float
               ) -> Callable[[float], float]:
    """Real ns since the step began -> seconds of playback: time runs at one speed inside a
    phase, slower in short phases so each shows for at least ``min_phase_s``."""
    total = max(story.duration_ns, 1)
    knots_real, knots_play = [0.0], [0.0]
    for _, a, b in story.phases:
        share = (b - a) / total * duration_s
        knots_real.append(float(b))
        knots_play.append(knots_play[-1] + (max(share, min_phase_s) if b > a else 0.0))

    def clock(t: float) -> float:
        t = min(max(t, 0.0), knots_real[-1])
        for i in range(1, len(knots_real)):
            a, b = knots_real[i - 1], knots_real[i]
            if t <= b:
                frac = (t - a) / (b - a) if b > a else 1.0
                return knots_play[i - 1] + frac * (knots_play[i] - knots_play[i - 1])
        return knots_play[-1]

    return clock


def _style(u: str) -> str:
    return f"""<style>
.{u} text {{ font-family: sans-serif; }}
.{u} .bar {{ transform-box: fill-box; transform-origin: left center;
  animation: {u}grow var(--d) linear var(--t) both; }}
.{u} .cap, .{u} .late {{ opacity: 0; animation: {u}show var(--d) step-start var(--t) none; }}
.{u} .late {{ animation-fill-mode: forwards; }}
.{u} .pkt {{ opacity: 0; animation: {u}hop var(--d) ease-in-out var(--t) none; }}
@keyframes {u}grow {{ from {{ transform: scaleX(0); }} to {{ transform: scaleX(1); }} }}
@keyframes {u}show {{ from {{ opacity: 1; }} to {{ opacity: 1; }} }}
@keyframes {u}hop {{ 0% {{ opacity: 1; transform: translate(0px, 0px); }}
  50% {{ transform: translate(calc(var(--dx) / 2), var(--dy)); }}
  100% {{ opacity: 1; transform: translate(var(--dx), 0px); }} }}
</style>"""


def _block(story: StepStory) -> int:
    """Height of one rank's block: its compute row, then one thin row per bucket."""
    return _ROW + 8 + _SUB * max(len(story.buckets), 1) + 22


def _row_y(story: StepStory, span: Span) -> tuple[float, float]:
    """(top, height) of a span: compute and waiting on the compute row (a rank waiting for a
    bucket computes nothing), each bucket's all-reduce on its own thin row."""
    top = _TOP + span.rank * _block(story)
    if span.op == Op.WAIT:
        return top + 5, 8
    if span.op != Op.ALL_REDUCE:
        return top, _ROW
    row = story.buckets.index(span.bucket if span.bucket is not None else -1)
    return top + _ROW + 8 + row * _SUB, _SUB - 1


def _timing(t: float, d: float) -> str:
    return f"--t:{t:.3f}s;--d:{max(d, 0.01):.3f}s"


def train_step_svg(story: StepStory, *, duration_s: float = 6.0, min_phase_s: float = 1.0
                   ) -> str:
    """The step as an animated SVG (plays once when shown; show it again to replay)."""
    u = f"lk{uuid.uuid4().hex[:8]}"  # one name space per drawing: several can share a page
    clock = play_clock(story, duration_s, min_phase_s)
    total_play = clock(story.duration_ns)
    scale = (_X1 - _X0) / max(story.duration_ns, 1)
    n = story.world_size
    block = _block(story)
    height = _TOP + n * block + 40
    wire_y = _TOP + n * block / 2 - 11
    out = [f'<svg class="{u}" xmlns="http://www.w3.org/2000/svg" width="{_W}" '
           f'height="{height}" viewBox="0 0 {_W} {height}">', _style(u)]
    out.append(f'<line x1="{_X0}" x2="{_X1}" y1="{wire_y}" y2="{wire_y}" stroke="#bbb" '
               f'stroke-dasharray="4 4"/><text x="{_X1}" y="{wire_y - 4}" font-size="10" '
               f'fill="#999" text-anchor="end">the wire</text>')
    sub_mid = max(_SUB * len(story.buckets) / 2 + 3, 16)
    for rank in range(n):
        y = float(_TOP + rank * block)
        rec = next((r for r in story.records if r["rank"] == rank), {})
        loss = f"loss {rec['loss']:.3f}" if "loss" in rec else ""
        out.append(f'<text x="4" y="{y + 14}" font-size="13" font-weight="bold">rank {rank}'
                   f'</text><text x="4" y="{y + 30}" font-size="10" fill="#555">{loss}</text>'
                   f'<text x="{_X0 - 6}" y="{y + 13}" font-size="9" fill="#888" '
                   f'text-anchor="end">compute</text><text x="{_X0 - 6}" y="{y + _ROW + 8 + sub_mid}" '
                   f'font-size="9" fill="#888" text-anchor="end">buckets</text>')
    for s in story.spans:
        y, h = _row_y(story, s)
        x, w = _X0 + s.start * scale, max((s.end - s.start) * scale, 1.5)
        t, d = clock(s.start), clock(s.end) - clock(s.start)
        out.append(f'<rect class="bar" style="{_timing(t, d)}" x="{x:.1f}" y="{y:.1f}" '
                   f'width="{w:.1f}" height="{h}" rx="1" fill="{COLORS[s.op]}"/>')
        if s.op == Op.ALL_REDUCE:  # the bucket itself, travelling to the wire and back
            dy = wire_y - y
            label = f"b{s.bucket}" if s.bucket is not None else "grad"
            out.append(f'<g class="pkt" style="{_timing(t, d)};--dx:{w:.1f}px;--dy:{dy:.1f}px">'
                       f'<rect x="{x - 12:.1f}" y="{y:.1f}" width="24" height="{h - 1}" rx="4" '
                       f'fill="{COLORS[Op.ALL_REDUCE]}" stroke="#fff"/><text x="{x:.1f}" '
                       f'y="{y + h - 4:.1f}" font-size="10" fill="#fff" text-anchor="middle">'
                       f'{label}</text></g>')
    out.extend(_captions(story, clock, total_play, block))
    # the playhead: one keyframe per phase boundary, so it slows down in short phases
    frames = []
    for _, _a, b in story.phases:
        pct = 100 * clock(b) / max(total_play, 1e-9)
        frames.append(f"{pct:.2f}% {{ transform: translateX({b * scale:.1f}px); }}")
    out.append(f'<style>@keyframes {u}head {{ 0% {{ transform: translateX(0px); }} '
               f'{" ".join(frames)} }}</style><line x1="{_X0}" x2="{_X0}" y1="{_TOP - 6}" '
               f'y2="{_TOP + n * block - 14}" stroke="#333" stroke-width="1.5" '
               f'style="animation: {u}head {total_play:.3f}s linear 0s both"/>')
    out.append(f'<text x="{_X0}" y="{height - 6}" font-size="10" fill="#666">0 ms</text>'
               f'<text x="{_X1}" y="{height - 6}" font-size="10" fill="#666" '
               f'text-anchor="end">{story.duration_ns / 1e6:.2f} ms (step {story.step}, '
               f'measured)</text>')
    out.append(_legend(height))
    out.append("</svg>")
    return "".join(out)


def _captions(story: StepStory, clock: Callable[[float], float], total_play: float,
              block: int) -> list[str]:
    out = []
    for i, (caption, a, b) in enumerate(story.phases):
        last = i == len(story.phases) - 1
        if last:
            caption += ": " + replica_summary(story)
        cls = "late" if last else "cap"
        t = clock(a)
        d = (total_play - t + 0.01) if last else clock(b) - t
        if d <= 0:
            continue
        out.append(f'<text class="{cls}" style="{_timing(t, d)}" x="4" y="20" font-size="14" '
                   f'font-weight="bold">{html.escape(caption)}</text>')
        if last:  # a tick beside every rank once its replica is proven equal
            mark = ("✓", "#59A14F") if story.replicas_equal else ("✗", "#E15759")
            for rank in range(story.world_size):
                y = _TOP + rank * block + 16
                out.append(f'<text class="late" style="{_timing(t, d)}" x="{_X1 + 4}" y="{y}" '
                           f'font-size="16" fill="{mark[1]}">{mark[0]}</text>')
    return out


def _legend(height: int) -> str:
    items = [(Op.FORWARD, "forward"), (Op.BACKWARD, "backward"),
             (Op.ALL_REDUCE, "all-reduce of a bucket"), (Op.WAIT, "waiting for a bucket"),
             (Op.OPTIMIZER, "update")]
    out, x = [], 200
    for op, label in items:
        out.append(f'<rect x="{x}" y="{height - 16}" width="10" height="10" '
                   f'fill="{COLORS[op]}"/><text x="{x + 14}" y="{height - 7}" font-size="10">'
                   f'{label}</text>')
        x += 30 + 6 * len(label)
    return "".join(out)


def replica_summary(story: StepStory) -> str:
    """The parameter hashes after the update, rank by rank, and whether they agree."""
    parts = [f"rank {r['rank']} {str(r.get('params_sha256', '?'))[:10]}" for r in story.records]
    verdict = "identical" if story.replicas_equal else "DIFFERENT"
    return f"params sha256 {', '.join(parts)} ({verdict})"


def step_table_html(story: StepStory) -> str:
    """The ranks' own numbers of the step: loss, first tensor's gradient norm before and
    after the all-reduce, its update, the bytes each bucket carried."""
    rows = []
    for r in story.records:
        rows.append(f"<tr style='text-align:left'><td>rank {r['rank']}</td><td>{r['loss']:.4f}</td>"
                    f"<td>{r['grad_norms_local'][0]:.4f}</td>"
                    f"<td>{r['grad_norms_synced'][0]:.4f}</td>"
                    f"<td>{r['update_norms'][0]:.6f}</td>"
                    f"<td><code>{str(r.get('params_sha256', '?'))[:16]}</code></td></tr>")
    buckets = sorted({(s.bucket, s.bytes) for s in story.spans
                      if s.op == Op.ALL_REDUCE and s.rank == 0}, key=lambda b: b[0] or 0)
    sizes = ", ".join(f"b{b}: {(nbytes or 0) / 1e3:.1f} kB" for b, nbytes in buckets)
    name = html.escape(story.records[0]["param_names"][0])
    head = "".join(f"<th style='padding:2px 12px;text-align:left'>{h}</th>" for h in (
        "", "loss (own shard)", f"|grad {name}| local", "after all-reduce", f"|Δw {name}|",
        "params sha256 after the update"))
    return (f"<table style='font-size:12px;border-collapse:collapse'><tr>{head}</tr>"
            f"{''.join(rows)}</table><div style='font-size:12px'>all-reduced per rank this "
            f"step: {sizes}</div>")
