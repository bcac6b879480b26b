"""Pipeline metrics measured from a run, next to the predictions for the same quantities.

Conventions (stated once, used everywhere in lesson 03):

* **Measured bubble fraction** of rank r in step s: the share of the step's *pipeline
  window* in which rank r ran no F / B (or I / W) action. The window runs from the first
  action's start on ANY rank to the last action's end on ANY rank, so it is the bubble as a
  **share of total step time** -- the same convention as the prediction
  ``(p-1)/(m+p-1)`` (``labkit.theory.bubble_fraction(..., relative_to="total")``). The
  optimizer update after the flush is not part of the window. The overall figure is the
  mean over ranks, averaged over the steps after the first (warm-up) step.
* **Relative to ideal**: bubble time / busy time, ``(p-1)/m`` for GPipe and 1F1B; reported
  as ``bubble_fraction_ideal`` (measured) and ``bubble_fraction_predicted_ideal``.
* **Peak activations**: the most (stage, microbatch) activations a rank held at once,
  counted exactly by the executor (1F1B: rank r holds p - r; GPipe: m).
* **Replayed bubble**: the plan simulated with the durations each action really took and
  free messages. The formula assumes every stage and microbatch costs the same; the replay
  keeps the run's own (uneven) compute and drops only communication, so
  ``measured - replayed`` is what sending activations and gradients added to the bubble.

Pure Python: works inside a rank (on gathered statistics) and on a saved ``Timeline``.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from labkit.base.events import Event, Op
from labkit.config.metrics import RankMetrics

PIPELINE_OPS = (Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT)

StepStat = tuple[int, int, int]
"""(first action start ns, last action end ns, busy ns) of one rank in one step."""


def step_stats(spans: Iterable[tuple[int, int]]) -> StepStat:
    """Summarise one rank's action spans of one step (they never overlap on a rank)."""
    spans = list(spans)
    if not spans:
        return (0, 0, 0)
    return (min(s for s, _ in spans), max(e for _, e in spans), sum(e - s for s, e in spans))


def _windows(stats: Sequence[Sequence[StepStat]]) -> list[tuple[int, int]]:
    """(step index, window ns) of each step where some rank worked; the window runs from
    the first action's start to the last action's end, on any rank."""
    out = []
    for k in range(min((len(s) for s in stats), default=0)):
        rows = [stats[r][k] for r in range(len(stats)) if stats[r][k][2] > 0]
        if rows:
            out.append((k, max(e for _, e, _ in rows) - min(s for s, _, _ in rows)))
    return out


def bubble_by_step(stats: Sequence[Sequence[StepStat]]) -> list[list[float]]:
    """``stats[rank][step]`` -> idle share ``[step][rank]`` of each step's shared window."""
    return [[1.0 - stats[r][k][2] / window if window > 0 else 0.0 for r in range(len(stats))]
            for k, window in _windows(stats)]


def bubble_summary(stats: Sequence[Sequence[StepStat]], skip_first: bool = True
                   ) -> dict[str, Any]:
    """Measured bubble per rank and overall (share of total), plus relative to ideal, and
    the mean pipeline window (``pipeline_ms``: the step's F/B work from first start to last
    end; unlike the step time it leaves out the optimizer and a rank's early start on the
    next step while another rank still drains this one)."""
    per_step, windows = bubble_by_step(stats), [w for _, w in _windows(stats)]
    if skip_first and len(per_step) > 1:
        per_step, windows = per_step[1:], windows[1:]
    if not per_step:
        return {"bubble_fraction": 0.0, "bubble_fraction_per_rank": [],
                "bubble_fraction_ideal": 0.0, "pipeline_ms": 0.0}
    ranks = len(per_step[0])
    per_rank = [statistics.fmean(step[r] for step in per_step) for r in range(ranks)]
    overall = statistics.fmean(per_rank)
    return {"bubble_fraction": overall, "bubble_fraction_per_rank": per_rank,
            "bubble_fraction_ideal": overall / (1.0 - overall) if overall < 1 else float("inf"),
            "pipeline_ms": statistics.fmean(windows) / 1e6}


def predictions(schedule: str, stages: int, microbatches: int, virtual: int,
                plan: Any = None) -> dict[str, Any]:
    """The predicted bubble for the same run: the closed form where one exists, and the
    plan simulated with F=1, B=2 time units (``labkit.schedules.planned_bubble_fraction``)."""
    from labkit.schedules import CLOSED_FORM, peak_in_flight, planned_bubble_fraction
    from labkit.theory import bubble_fraction

    out: dict[str, Any] = {}
    if plan is not None:
        out["bubble_fraction_planned"] = planned_bubble_fraction(plan)
        out["peak_activations_predicted"] = [peak_in_flight(plan, r) for r in range(stages)]
    if schedule in CLOSED_FORM:
        out["bubble_fraction_predicted"] = bubble_fraction(stages, microbatches, schedule,
                                                           virtual, "total")
        out["bubble_fraction_predicted_ideal"] = bubble_fraction(stages, microbatches, schedule,
                                                                 virtual, "ideal")
    elif plan is not None:  # zb and hand-written plans: the simulated plan is the prediction
        out["bubble_fraction_predicted"] = out["bubble_fraction_planned"]
        b = out["bubble_fraction_planned"]
        out["bubble_fraction_predicted_ideal"] = b / (1 - b) if b < 1 else float("inf")
    return out


def overhead_note(measured: float, predicted: float, mean_action_ms: float,
                  slack: float = 0.05, short_ms: float = 5.0) -> str | None:
    """A hint for a run whose bubble is well above the prediction because its actions are
    too short for the fixed cost of each message (~0.5 ms on gloo) to vanish; else None."""
    if measured - predicted <= slack or mean_action_ms >= short_ms:
        return None
    return (f"actions last {mean_action_ms:.1f} ms on average, so the fixed cost of each "
            f"message and of Python weighs on the bubble ({measured:.3f} measured vs "
            f"{predicted:.3f} predicted); give each microbatch more compute to see the "
            f"formula, e.g. --width 1024 --depth 16 --batch-size 1024")


# ---- the run's metrics from every rank's record (parent side) ------------------------------
@dataclass
class PipelineMetrics(RankMetrics):
    """What one pipeline rank measured; ``combine`` turns every rank's record into the
    bubble, stage times, activations and messages of the run."""

    step_stats: list[StepStat] | None = None
    """Per step: (first action start ns, last action end ns, busy ns) on this rank."""
    stage_ms: list[float] | None = None
    """Per model stage: this rank's mean compute per microbatch (0 for stages it lacks)."""
    peak_activations_held: int | None = None
    messages_per_step: float | None = None
    bytes_per_step: float | None = None
    max_abs_diff_grads: float | None = None
    max_abs_diff_loss: float | None = None
    schedule: str | None = None
    stages: int | None = None
    microbatches: int | None = None
    virtual: int | None = None
    stage_bounds: list[int] | None = None
    balance: str | None = None

    REPORTED: ClassVar[tuple[str, ...]] = (
        "schedule", "stages", "microbatches", "virtual", "bubble_fraction",
        "bubble_fraction_predicted", "bubble_fraction_planned", "bubble_fraction_ideal",
        "bubble_fraction_predicted_ideal", "p2p_messages_per_step", "p2p_bytes_per_step")

    @classmethod
    def report_lines(cls, metrics: dict[str, Any]) -> list[str]:
        from labkit.analysis.report import number

        m = metrics
        if "bubble_fraction" not in m:
            return []
        lines = [f"  pipeline      {m['schedule']}, {m['stages']} stages x {m['microbatches']} "
                 f"microbatches (virtual {m['virtual']})",
                 f"  bubble        measured {m['bubble_fraction']:.3f} of the step, predicted "
                 f"{m.get('bubble_fraction_predicted', float('nan')):.3f} "
                 f"((p-1)/(m+p-1) as a share of total)",
                 f"  per rank      bubble {number(m['bubble_fraction_per_rank'])}, peak "
                 f"activations {m['peak_activations']} (predicted "
                 f"{m['peak_activations_predicted']})",
                 f"  messages      {m['p2p_messages_per_step']:.0f} sends/step, "
                 f"{m['p2p_bytes_per_step'] / 1e6:.3f} MB/step"]
        return lines

    @classmethod
    def combine(cls, records: Sequence[RankMetrics], config: Any) -> dict[str, Any]:
        from labkit.strategies.pipeline import options_for, plan_for

        recs = [r for r in records if isinstance(r, PipelineMetrics)]
        out = super().combine(recs, config)
        for key in ("step_stats", "stage_ms", "peak_activations_held", "messages_per_step",
                    "bytes_per_step"):
            out.pop(key, None)
        first = recs[0]
        plan = plan_for(options_for(config), first.stages or len(recs))
        stats = [r.step_stats or [] for r in recs]
        # 1. measured, beside the predictions (both as shares of total step time)
        out.update(bubble_summary(stats))
        out.update(predictions(first.schedule or "", plan.stages, plan.microbatches,
                               plan.virtual, plan))
        num = plan.num_model_stages
        out["stage_time_ms"] = [sum((r.stage_ms or [0.0] * num)[s] for r in recs)
                                for s in range(num)]
        out["peak_activations"] = [r.peak_activations_held for r in recs]
        out["p2p_messages_per_step"] = sum(r.messages_per_step or 0 for r in recs)
        out["p2p_bytes_per_step"] = sum(r.bytes_per_step or 0 for r in recs)
        # 2. a hint when actions are too short for the formula's assumptions
        busy = [st[2] for row in stats for st in (row[1:] or row)]
        actions = sum(len(plan.actions(r)) for r in range(plan.stages)) / plan.stages
        if busy and "bubble_fraction_predicted" in out:
            note = overhead_note(out["bubble_fraction"], out["bubble_fraction_predicted"],
                                 statistics.fmean(busy) / actions / 1e6)
            if note:
                out["note"] = note
        return out


# ---- the same numbers from a Timeline (parent side: visuals, bench, tests) ----------------
def actions_of(events: Iterable[Event]) -> list[Event]:
    """The pipeline actions (F / B / I / W spans that carry a stage) of a run."""
    return [e for e in events if e.op in PIPELINE_OPS and e.stage is not None]


def timeline_stats(timeline: Any) -> list[list[StepStat]]:
    """``stats[rank][step]`` from a Timeline's action spans (steps in order)."""
    acts = actions_of(timeline.events)
    steps = sorted({e.step for e in acts if e.step is not None})
    return [[step_stats((e.start_ns, e.end_ns) for e in acts if e.rank == r and e.step == s)
             for s in steps] for r in range(timeline.world_size)]


def timeline_bubble(timeline: Any, skip_first: bool = True) -> dict[str, Any]:
    """Measured bubble of a recorded pipeline run (see the conventions above)."""
    return bubble_summary(timeline_stats(timeline), skip_first)


_SCHEDULE_OP = {Op.FORWARD: "F", Op.BACKWARD: "B", Op.BACKWARD_INPUT: "I",
                Op.BACKWARD_WEIGHT: "W"}


def replayed_bubble(timeline: Any, plan: Any, skip_first: bool = True, *,
                    dedicated: bool = True) -> float:
    """Bubble (share of total) of ``plan`` replayed with free communication and each action's
    cost, averaged over the steps (the first, warm-up step skipped).

    ``dedicated=True``: an action costs the CPU time its thread used (``Event.cpu_ns``: as if
    the rank had a core of its own; its wall time where the trace has no CPU time, e.g. on a
    GPU); ``False``: the wall time it took, waits for a core included."""
    from labkit.schedules import Action, planned_bubble_fraction
    from labkit.schedules import Op as PlanOp

    by_step: dict[int, dict[Any, float]] = {}
    for e in steady_actions(timeline.events, skip_first):
        if e.step is None or e.microbatch is None:
            continue
        assert e.stage is not None
        action = Action(e.stage, PlanOp(_SCHEDULE_OP[e.op]), e.microbatch)
        cost = e.cpu_ns if dedicated and e.cpu_ns is not None else e.dur_ns
        costs = by_step.setdefault(e.step, {})
        costs[action] = costs.get(action, 0.0) + cost / 1e9  # an action cut by a blocking message
    if not by_step:
        return 0.0
    return statistics.fmean(planned_bubble_fraction(plan, durations=d) for d in by_step.values())


def steady_actions(events: Iterable[Event], skip_first_step: bool = True) -> list[Event]:
    """The pipeline actions, without the first (warm-up) step when the run has more than one."""
    acts = actions_of(events)
    steps = sorted({e.step for e in acts if e.step is not None})
    if skip_first_step and len(steps) > 1:
        acts = [e for e in acts if e.step != steps[0]]
    return acts


def op_times_ms(events: Iterable[Event], skip_first_step: bool = True) -> dict[str, float]:
    """Mean duration of each kind of action (forward, backward, backward_input, ...) in ms."""
    acts = steady_actions(events, skip_first_step)
    by_op: dict[str, list[int]] = {}
    for e in acts:
        by_op.setdefault(e.op.value, []).append(e.dur_ns)
    return {op: statistics.fmean(d) / 1e6 for op, d in by_op.items()}


def stage_times_ms(events: Iterable[Event], skip_first_step: bool = True) -> dict[int, float]:
    """Mean compute time per microbatch of each model stage (F + B, or F + I + W), in ms."""
    acts = steady_actions(events, skip_first_step)
    total: dict[int, int] = {}
    count: dict[int, set[tuple[Any, Any]]] = {}
    for e in acts:
        assert e.stage is not None
        total[e.stage] = total.get(e.stage, 0) + e.dur_ns
        count.setdefault(e.stage, set()).add((e.step, e.microbatch))
    return {s: total[s] / len(count[s]) / 1e6 for s in sorted(total)}


def p2p_per_step(events: Iterable[Event]) -> dict[str, float]:
    """Point-to-point sends per step, summed over ranks: messages and bytes."""
    sends = [e for e in events if e.op == Op.SEND and e.step is not None]
    steps = {e.step for e in sends}
    n = max(len(steps), 1)
    return {"p2p_messages_per_step": len(sends) / n,
            "p2p_bytes_per_step": sum(e.bytes or 0 for e in sends) / n}
