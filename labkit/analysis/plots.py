"""Timeline figures: one row per rank, its compute and comm lanes stacked inside it.

Every function returns a matplotlib ``Figure`` (never calls ``plt.show()``), so a notebook
shows it, a test inspects it and a script saves it. Colours come from one table keyed by
``Op``; the same colours are used by every lesson's plots (planned vs measured schedules,
DDP variants side by side, ZeRO steps) so a student learns them once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from labkit.base.events import Event, Lane, Op, match_sends

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from labkit.analysis.timeline import Timeline

COLORS: dict[Op, str] = {
    Op.FORWARD: "#4C9BE8", Op.BACKWARD: "#F28E2B", Op.BACKWARD_INPUT: "#F6B26B",
    Op.BACKWARD_WEIGHT: "#C26A16", Op.RECOMPUTE: "#9CC3EE", Op.LOSS: "#76B7B2",
    Op.OPTIMIZER: "#59A14F", Op.DATA: "#BAB0AC", Op.COMPRESS: "#B07AA1",
    Op.CHECKPOINT: "#9C755F", Op.ALL_REDUCE: "#E15759", Op.REDUCE_SCATTER: "#FF9DA7",
    Op.ALL_GATHER: "#AF7AA1", Op.BROADCAST: "#EDC948", Op.GATHER: "#B6992D",
    Op.REDUCE: "#D37295",
    Op.ALL_TO_ALL: "#8CD17D", Op.SEND: "#D4A6C8", Op.RECV: "#A0CBE8", Op.BARRIER: "#79706E",
    Op.WAIT: "#D7D7D7", Op.STEP: "#F0F0F0",
}
LANE_ORDER = (Lane.COMPUTE, Lane.COMM)
AXIS_COLORS = {"dp": "#E15759", "pp": "#9467BD", "tp": "#2CA02C", "cp": "#F28E2B", "ep": "#17BECF"}
"""Communication coloured by the grid axis it ran on, when a run uses several axes."""


def _axes_in(events: Iterable[Event]) -> list[str]:
    return sorted({e.axis for e in events if e.lane == Lane.COMM and e.axis is not None})


def _color(e: Event, by_axis: bool) -> str:
    if by_axis and e.lane == Lane.COMM and e.axis in AXIS_COLORS and e.op != Op.WAIT:
        return AXIS_COLORS[e.axis]
    return COLORS[e.op]


def new_figure(figsize: tuple[float, float] = (8, 4.5)) -> Figure:
    """A figure that Jupyter displays as an image when a cell returns it.

    Made through pyplot (which registers the notebook's inline PNG display) and closed at
    once, so it is shown only where it is returned, never twice. A bare
    ``matplotlib.figure.Figure()`` would show as ``<Figure size ...>`` text in a notebook
    where nothing imported pyplot yet.
    """
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=figsize)
    plt.close(fig)
    return fig


def _units(span_ns: float) -> tuple[float, str]:
    if span_ns >= 2e9:
        return 1e9, "s"
    if span_ns >= 2e6:
        return 1e6, "ms"
    return 1e3, "µs"


def draw_timeline(ax: Axes, events: Sequence[Event], ranks: Iterable[int], *,
                  scale: float, origin: float = 0.0, labels: bool = True,
                  links: bool = True, row_labels: Sequence[str] | None = None) -> None:
    """Draw events on ``ax``: rank r occupies y in [r, r+1), compute above comm. Traffic
    on several grid axes is coloured by axis (``AXIS_COLORS``)."""
    ranks = list(ranks)
    lane_h = 0.42
    by_axis = len(_axes_in(events)) > 1
    shown = [e for e in events if e.lane in LANE_ORDER and e.rank in ranks]
    extent = (max((e.end_ns for e in shown), default=1) - min((e.start_ns for e in shown),
                                                              default=0)) / scale
    # a label is drawn only where it fits inside its span and clears the previous label of
    # its lane (spans of a comm lane overlap: an isend runs while the next one starts)
    fig = ax.get_figure(root=True)
    width_pt = max(1.0, ax.get_position().width * fig.get_figwidth() * 72)  # type: ignore[union-attr]
    per_char = 6 * 0.62 * extent / width_pt  # a 6 pt glyph, in data units
    label_end: dict[tuple[int, Lane], float] = {}
    for e in sorted(shown, key=lambda e: e.start_ns):
        row = ranks.index(e.rank)
        y = row + (0.05 if e.lane == Lane.COMPUTE else 0.5)
        x, w = (e.start_ns - origin) / scale, max(e.dur_ns / scale, 1e-9)
        ax.broken_barh([(x, w)], (y, lane_h), facecolors=_color(e, by_axis), edgecolor="white",
                       linewidth=0.3)
        need = (len(e.name) + 1) * per_char if e.name else 0.0
        if labels and e.name and w >= need and x + (w - need) / 2 >= label_end.get(
                (row, e.lane), float("-inf")):
            ax.text(x + w / 2, y + lane_h / 2, e.name, ha="center", va="center", fontsize=6,
                    clip_on=True)
            label_end[(row, e.lane)] = x + (w + need) / 2
    if links:
        for s, r in match_sends(list(events)):
            if s.rank in ranks and r.rank in ranks:
                ax.annotate("", xy=((r.end_ns - origin) / scale, ranks.index(r.rank) + 0.7),
                            xytext=((s.start_ns - origin) / scale, ranks.index(s.rank) + 0.7),
                            arrowprops={"arrowstyle": "->", "color": "#555", "lw": 0.6,
                                        "alpha": 0.6})
    ax.set_yticks([i + 0.5 for i in range(len(ranks))])
    ax.set_yticklabels(list(row_labels) if row_labels is not None else [f"rank {r}" for r in ranks])
    ax.set_ylim(len(ranks), 0)


def _legend(ax: Axes, events: Iterable[Event]) -> None:
    from matplotlib.patches import Patch

    events = list(events)
    axes = _axes_in(events)
    by_axis = len(axes) > 1
    ops = sorted({e.op for e in events if e.lane in LANE_ORDER
                  and not (by_axis and e.lane == Lane.COMM and e.op != Op.WAIT)},
                 key=lambda o: list(Op).index(o))
    handles = [Patch(color=COLORS[o], label=o.value) for o in ops]
    if by_axis:
        handles += [Patch(color=AXIS_COLORS[a], label=f"{a} traffic") for a in axes]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8,
              frameon=False)


def plot_timeline(timeline: Timeline, steps: Iterable[int] | None = None, *,
                  title: str | None = None, ax: Axes | None = None, labels: bool = True,
                  links: bool = True) -> Figure:
    """Gantt chart of a run: a row per rank, compute (top) and comm (bottom) lanes.

    ``steps`` picks which steps to draw (default: all). Arrows link each send to its recv.
    """
    import matplotlib.pyplot as plt

    events = timeline.events if steps is None else timeline.select(steps=steps)
    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 0.8 + 0.7 * timeline.world_size))
    else:
        fig = ax.get_figure(root=True)  # type: ignore[assignment]
    if not events:
        ax.text(0.5, 0.5, "no events recorded", ha="center", transform=ax.transAxes)
        return fig
    origin = min(e.start_ns for e in events)
    scale, unit = _units(max(e.end_ns for e in events) - origin)
    draw_timeline(ax, events, timeline.ranks, scale=scale, origin=origin, labels=labels,
                  links=links, row_labels=timeline.rank_labels())
    ax.set_xlabel(f"time ({unit}) — compute lane above, communication lane below")
    ax.set_title(title or _title(timeline))
    _legend(ax, events)
    fig.tight_layout()
    plt.close(fig)  # returned, not shown: the notebook displays it
    return fig


def _title(timeline: Timeline) -> str:
    cfg: dict[str, Any] = timeline.meta.get("config", {})
    if not cfg:
        return f"timeline, {timeline.world_size} ranks"
    return (f"{cfg.get('strategy')} on {timeline.world_size} ranks "
            f"({timeline.meta.get('backend', '')})")


def plot_timelines(timelines: dict[str, Timeline], steps: Iterable[int] | None = None,
                   *, share_x: bool = True) -> Figure:
    """Several runs stacked (e.g. three DDP variants), on one time scale when ``share_x``."""
    import matplotlib.pyplot as plt

    n = len(timelines)
    heights = [0.6 + 0.6 * t.world_size for t in timelines.values()]
    fig, axes = plt.subplots(n, 1, figsize=(10, sum(heights) + 0.5), sharex=share_x,
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    chosen = list(steps) if steps is not None else None
    spans = []
    for (name, tl), ax in zip(timelines.items(), axes[:, 0]):
        events = tl.events if chosen is None else tl.select(steps=chosen)
        origin = min((e.start_ns for e in events), default=0)
        spans.append((events, origin, tl, name, ax))
    longest = max((max((e.end_ns for e in ev), default=o) - o for ev, o, *_ in spans), default=1)
    scale, unit = _units(longest)
    for events, origin, tl, name, ax in spans:
        draw_timeline(ax, events, tl.ranks, scale=scale, origin=origin, labels=False)
        ax.set_title(name, fontsize=10, loc="left")
    axes[-1, 0].set_xlabel(f"time ({unit})")
    _legend(axes[0, 0], [e for ev, *_ in spans for e in ev])
    fig.tight_layout()
    plt.close(fig)
    return fig
