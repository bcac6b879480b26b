"""Lesson 03 figures: the planned schedule beside the measured one, the bubble sweep, balance.

What this teaches: the plan (``labkit.schedules``) and the run are drawn with the SAME
colours and ``2F0`` labels (stage 2, forward, microbatch 0), so a student can hold the
textbook diagram next to what their own ranks did. The planned side is simulated with
F = 1 and B = 2 time units (the usual "backward costs twice forward" assumption); the
measured side is the run's timeline, with arrows from each send to its recv.

Every function returns a matplotlib ``Figure`` (never shown here).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from labkit.analysis.plots import COLORS, _legend, _units, draw_timeline
from labkit.base.errors import ConfigError
from labkit.base.events import Op as Ev
from labkit.schedules import DEFAULT_COSTS, Op, Plan, simulate

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from labkit.analysis.timeline import Timeline

ACTION_COLORS: dict[Op, str] = {Op.F: COLORS[Ev.FORWARD], Op.B: COLORS[Ev.BACKWARD],
                                Op.I: COLORS[Ev.BACKWARD_INPUT], Op.W: COLORS[Ev.BACKWARD_WEIGHT]}


def draw_plan(ax: Axes, plan: Plan, costs: Mapping[Op, float] | None = None) -> float:
    """Draw ``plan`` simulated with ``costs`` (default F=1, B=2) on ``ax``; returns its span."""
    events = simulate(plan, dict(costs) if costs else None)
    for e in events:
        ax.broken_barh([(e.start, e.duration)], (e.rank + 0.05, 0.42),
                       facecolors=ACTION_COLORS[e.action.op], edgecolor="white", linewidth=0.5)
        ax.text(e.start + e.duration / 2, e.rank + 0.26, str(e.action), ha="center",
                va="center", fontsize=7, clip_on=True)
    ax.set_yticks([r + 0.5 for r in range(plan.stages)])
    ax.set_yticklabels([f"rank {r}" for r in range(plan.stages)])
    ax.set_ylim(plan.stages, 0)
    span = max((e.end for e in events), default=1.0)
    ax.set_xlim(0, span)
    return span


def plot_plan(plan: Plan, costs: Mapping[Op, float] | None = None, *,
              title: str | None = None) -> Figure:
    """The planned schedule alone: one row per rank, one box per action."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.7 + 0.6 * plan.stages))
    draw_plan(ax, plan, costs)
    ax.set_xlabel(_cost_label(plan, costs))
    ax.set_title(title or _plan_title(plan))
    fig.tight_layout()
    plt.close(fig)
    return fig


def _cost_label(plan: Plan, costs: Mapping[Op, float] | None = None) -> str:
    """'planned time (units: F = 1, B = 2)', naming only the ops the plan uses."""
    merged = {**DEFAULT_COSTS, **(costs or {})}
    used = [op for op in Op if any(a.op is op for r in plan.order for a in plan.actions(r))]
    return "planned time (units: " + ", ".join(f"{op.value} = {merged[op]:g}"
                                               for op in used) + ")"


def _plan_title(plan: Plan) -> str:
    v = f", v={plan.virtual}" if plan.virtual > 1 else ""
    return f"planned {plan.schedule}: p={plan.stages}, m={plan.microbatches}{v}"


def plot_planned_vs_measured(plan: Plan, timeline: Timeline, step: int | None = None
                             ) -> Figure:
    """Planned (left) and measured (right) for one step, same colours and labels.

    The measured side shows the compute lane (``2F0`` boxes) above the comm lane of each
    rank; arrows link each send to the recv that took it. ``step`` defaults to the last.
    """
    import matplotlib.pyplot as plt

    steps = timeline.steps()
    chosen = step if step is not None else (steps[-1] if steps else None)
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 1.0 + 0.8 * plan.stages))
    draw_plan(left, plan)
    left.set_title(_plan_title(plan) + "  (prediction)")
    left.set_xlabel(_cost_label(plan))
    events = [e for e in timeline.select(step=chosen) if e.op != Ev.STEP]
    if events:
        origin = min(e.start_ns for e in events)
        scale, unit = _units(max(e.end_ns for e in events) - origin)
        draw_timeline(right, events, timeline.ranks, scale=scale, origin=origin)
        right.set_xlabel(f"measured time ({unit}); compute above, send/recv below")
        _legend(right, events)  # every colour the two panels use
    right.set_title(f"measured, step {chosen}  (your run)")
    fig.tight_layout()
    plt.close(fig)
    return fig


def plot_bubble_sweep(stages: int, measured: Mapping[int, float], *, schedule: str = "gpipe",
                      virtual: int = 1, max_microbatches: int = 16,
                      stage_costs: Sequence[float] | Mapping[int, Sequence[float]] | None = None
                      ) -> Figure:
    """Bubble fraction (share of total step time) vs microbatches: curve predicted, dots
    measured. ``measured`` maps microbatches -> the run's ``bubble_fraction``.
    ``stage_costs`` (each stage's time a microbatch, e.g. a run's ``stage_time_ms``) adds,
    dotted, the bubble those unequal stages give when the slowest sets the pace
    (``labkit.theory.uneven_bubble_fraction``; GPipe and 1F1B, one chunk per rank); a mapping
    m -> costs (``labkit.lessons.pipeline_text.sweep_stage_costs``: each m's own runs) marks
    that bubble at each m with a diamond instead, the number lesson 03's verdict judges."""
    import matplotlib.pyplot as plt

    from labkit.theory import bubble_fraction, uneven_bubble_fraction

    top = max([max_microbatches, *measured])
    ms = list(range(1, top + 1))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(ms, [bubble_fraction(stages, m, schedule, virtual, "total") for m in ms], "-",
            color="#555", label=f"predicted (p-1)/(m+p-1), p={stages}")
    marks: dict[int, list[float]] = {}  # each m's own stages: a diamond at each m
    curve: list[float] | None = None  # one list of stages: the dotted curve
    if isinstance(stage_costs, Mapping):
        marks = {m: list(c) for m, c in stage_costs.items()}
    elif stage_costs is not None:
        curve = list(stage_costs)
    checked = [(f"stage_costs[{m}]", c) for m, c in marks.items()]
    for name, costs in checked + ([("stage_costs", curve)] if curve is not None else []):
        if len(costs) != stages or virtual != 1 or min(costs, default=0) <= 0:
            raise ConfigError(f"{name} ({costs!r}) must hold one positive "
                              f"time per stage ({stages}) of a plan with one chunk per rank "
                              f"(virtual={virtual}); e.g. "
                              f"stage_costs=run.metrics['stage_time_ms']")
    if curve is not None:
        ratio = max(curve) / min(curve)
        ax.plot(ms, [uneven_bubble_fraction(curve, m) for m in ms], ":",
                color="#555", label=f"your stages (slowest {ratio:.2f}x the fastest) set the pace")
    if marks:
        at = sorted(marks)
        ax.plot(at, [uneven_bubble_fraction(marks[m], m) for m in at], "D", zorder=3,
                markerfacecolor="none", color="#222", markersize=12, markeredgewidth=1.5,
                label="your stages' bubble at each m (the slowest sets the pace)")
    xs = sorted(measured)
    ax.plot(xs, [measured[m] for m in xs], "o", color=COLORS[Ev.BACKWARD], markersize=8,
            label="measured (idle share of the step, your run)")
    for m in xs:
        ax.annotate(f"{measured[m]:.2f}", (m, measured[m]), textcoords="offset points",
                    xytext=(6, 6), fontsize=8)
    ax.set_xlabel("microbatches m")
    ax.set_ylabel("bubble fraction (share of total step time)")
    ax.set_ylim(0, 1)
    ax.set_title(f"{schedule}: the bubble shrinks as microbatches grow")
    ax.legend(fontsize=8)
    fig.tight_layout()
    plt.close(fig)
    return fig


def plot_stage_balance(stage_ms: Mapping[str, Sequence[float]],
                       step_ms: Mapping[str, float] | None = None) -> Figure:
    """Per-stage compute time per microbatch for each partition, the slowest stage marked.

    ``stage_ms`` maps a label ("by layer count", "by measured cost") to each stage's time
    (the runs' ``stage_time_ms``); ``step_ms`` optionally their measured step times, shown
    as the speedup of each partition over the first.
    """
    import matplotlib.pyplot as plt

    labels = list(stage_ms)
    fig, axes = plt.subplots(1, len(labels), figsize=(4.5 * len(labels), 3.6), sharey=True,
                             squeeze=False)
    first = step_ms[labels[0]] if step_ms else None
    for ax, label in zip(axes[0], labels):
        times = list(stage_ms[label])
        slow = max(range(len(times)), key=lambda s: times[s])
        colors = [COLORS[Ev.BACKWARD] if s == slow else COLORS[Ev.FORWARD]
                  for s in range(len(times))]
        ax.bar([f"stage {s}" for s in range(len(times))], times, color=colors)
        ax.axhline(times[slow], color="#333", linestyle="--", linewidth=0.8)
        title = f"{label}\nslowest stage {slow}: {times[slow]:.2f} ms / microbatch"
        if step_ms and first:
            title += f"\nstep {step_ms[label]:.1f} ms, speedup x{first / step_ms[label]:.2f}"
        ax.set_title(title, fontsize=9)
    axes[0][0].set_ylabel("F + B time per microbatch (ms)")
    fig.tight_layout()
    plt.close(fig)
    return fig


def metrics_table(rows: Mapping[str, Mapping[str, Any]], keys: Sequence[str]) -> str:
    """A plain-text table of selected metrics per run (predicted and measured side by side)."""
    head = ["run", *keys]
    body = [[name, *(_fmt(m.get(k)) for k in keys)] for name, m in rows.items()]
    widths = [max(len(str(r[i])) for r in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in [head, *body]]
    return "\n".join(lines)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)
