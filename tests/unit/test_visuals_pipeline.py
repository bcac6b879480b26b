"""Lesson 03 figures, animation and widget, on a fake recorded run (no processes)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from matplotlib.figure import Figure

from labkit.analysis.timeline import Timeline
from labkit.base.events import Event, Lane, Op
from labkit.schedules import build_plan, simulate
from labkit.visuals.pipeline import (
    metrics_table,
    plot_bubble_sweep,
    plot_plan,
    plot_planned_vs_measured,
    plot_stage_balance,
)
from labkit.visuals.pipeline_anim import pipeline_animation, pipeline_animation_html

pytestmark = pytest.mark.lesson03


def _fake_run(schedule: str = "1f1b", p: int = 2, m: int = 4) -> Timeline:
    """The simulated plan as a recorded run: F/B spans in ms, one send+recv per boundary."""
    evs = []
    for e in simulate(build_plan(schedule, p, m)):
        op = Op.FORWARD if e.action.op.value == "F" else Op.BACKWARD
        start, dur = int(e.start * 1e6), int(e.duration * 1e6)
        evs.append(Event(e.rank, Lane.COMPUTE, op, start, dur, step=0,
                         microbatch=e.action.microbatch, stage=e.action.stage,
                         name=str(e.action)))
        if op == Op.FORWARD and e.rank < p - 1:
            evs.append(Event(e.rank, Lane.COMM, Op.SEND, start + dur, 10_000, step=0,
                             peer=e.rank + 1, bytes=64, microbatch=e.action.microbatch,
                             stage=e.action.stage))
            evs.append(Event(e.rank + 1, Lane.COMM, Op.RECV, start + dur, 20_000, step=0,
                             peer=e.rank, bytes=64, microbatch=e.action.microbatch,
                             stage=e.action.stage + 1))
    evs.append(Event(0, Lane.STEP, Op.STEP, 0, max(e.end_ns for e in evs), step=0))
    return Timeline(sorted(evs, key=lambda e: e.start_ns), p)


def _texts(ax: object) -> list[str]:
    return [t.get_text() for t in ax.texts if t.get_text()]  # type: ignore[attr-defined]


def test_plot_plan_draws_one_labelled_box_per_action() -> None:
    plan = build_plan("gpipe", 2, 3)
    fig = plot_plan(plan)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert len(ax.collections) == 12
    assert sorted(_texts(ax)) == sorted(str(a) for r in (0, 1) for a in plan.actions(r))
    assert ax.get_xlabel() == "planned time (units: F = 1, B = 2)"


def test_plan_axis_names_the_costs_of_the_ops_it_uses() -> None:
    """A zero-bubble plan is drawn with I and W, not B; given costs show as given."""
    from labkit.schedules import Op as PlanOp

    assert plot_plan(build_plan("zb", 2, 4)).axes[0].get_xlabel() == (
        "planned time (units: F = 1, I = 1, W = 1)")
    fig = plot_plan(build_plan("1f1b", 2, 4), {PlanOp.B: 3.0})
    assert fig.axes[0].get_xlabel() == "planned time (units: F = 1, B = 3)"


def test_planned_vs_measured_share_labels_and_link_sends() -> None:
    """Both panels carry the same 2F0 labels; the measured one links sends to recvs."""
    plan = build_plan("1f1b", 2, 4)
    fig = plot_planned_vs_measured(plan, _fake_run())
    left, right = fig.axes[:2]
    assert sorted(_texts(left)) == sorted(_texts(right))  # same names, same count
    assert "prediction" in left.get_title() and "measured" in right.get_title()
    arrows = [c for c in right.get_children() if type(c).__name__ == "Annotation"]
    assert len(arrows) == 4  # one per forward send of rank 0
    assert left.collections[0].get_facecolor().tolist() == \
        right.collections[0].get_facecolor().tolist()  # 0F0 is blue on both sides


def test_bubble_sweep_puts_measured_points_on_the_predicted_curve() -> None:
    fig = plot_bubble_sweep(2, {2: 0.35, 4: 0.22, 8: 0.12}, max_microbatches=8)
    curve, dots = fig.axes[0].lines[:2]
    assert list(curve.get_xdata()) == list(range(1, 9))
    assert curve.get_ydata()[3] == pytest.approx(1 / 5)  # m=4, p=2
    assert list(dots.get_xdata()) == [2, 4, 8]
    assert list(dots.get_ydata()) == [0.35, 0.22, 0.12]


def test_bubble_sweep_draws_what_unequal_stages_give_dotted() -> None:
    """A last stage 1.1x the first: the dotted curve reads 0.222 at m = 4 and 0.143 at m = 8
    (the slowest stage paces the pipeline), above the formula's 0.20 and 0.11; equal stages
    lie on the formula; a cost list that does not fit the plan is refused, naming it."""
    from labkit.base.errors import ConfigError

    ax = plot_bubble_sweep(2, {4: 0.23}, max_microbatches=8, stage_costs=[10.0, 11.0]).axes[0]
    dotted = next(line for line in ax.lines if line.get_linestyle() == ":")
    assert dotted.get_ydata()[3] == pytest.approx(1 - 4 * 21 / (2 * (21 + 3 * 11)))  # 0.222
    assert dotted.get_ydata()[7] == pytest.approx(1 - 8 * 21 / (2 * (21 + 7 * 11)))  # 0.143
    assert "1.10x" in dotted.get_label()
    even = plot_bubble_sweep(2, {4: 0.2}, max_microbatches=8, stage_costs=[5.0, 5.0]).axes[0]
    curve, flat, _dots = even.lines
    assert list(flat.get_ydata()) == pytest.approx(list(curve.get_ydata()))
    with pytest.raises(ConfigError, match=r"stage_costs \(\[1.0, 2.0, 3.0\]\).*stage \(2\)"):
        plot_bubble_sweep(2, {4: 0.2}, stage_costs=[1.0, 2.0, 3.0])


def test_bubble_sweep_marks_each_ms_own_stages_with_a_diamond() -> None:
    """Each m's own stage costs (a sweep's ``sweep_stage_costs``): one diamond per m at the
    bubble they give (what lesson 03's verdict judges), no dotted curve; a bad entry is
    refused by its m."""
    from labkit.base.errors import ConfigError

    ax = plot_bubble_sweep(2, {4: 0.23, 8: 0.15}, max_microbatches=8,
                           stage_costs={4: [10.0, 11.0], 8: [5.0, 6.0]}).axes[0]
    assert not [line for line in ax.lines if line.get_linestyle() == ":"]
    marks = next(line for line in ax.lines if line.get_marker() == "D")
    assert list(marks.get_xdata()) == [4, 8]
    assert list(marks.get_ydata()) == pytest.approx([1 - 4 * 21 / (2 * (21 + 3 * 11)),
                                                     1 - 8 * 11 / (2 * (11 + 7 * 6))])
    with pytest.raises(ConfigError, match=r"stage_costs\[8\] \(\[5.0, 0.0\]\)"):
        plot_bubble_sweep(2, {4: 0.2}, stage_costs={4: [1.0, 1.0], 8: [5.0, 0.0]})


def test_stage_balance_marks_the_slowest_stage_and_speedup() -> None:
    fig = plot_stage_balance({"by layer count": [2.0, 7.0], "by measured cost": [3.0, 6.0]},
                             {"by layer count": 70.0, "by measured cost": 60.0})
    a, b = fig.axes
    assert [p.get_height() for p in a.patches] == [2.0, 7.0]
    assert "slowest stage 1" in a.get_title() and "x1.17" in b.get_title()


@pytest.mark.filterwarnings("ignore:Animation was deleted")
def test_animation_replays_the_recorded_step() -> None:
    tl = _fake_run()
    anim = pipeline_animation(tl, frames=5)
    fig = anim._fig  # type: ignore[attr-defined]
    anim._func(4)  # type: ignore[attr-defined]  # the last frame: everything has run
    boxes = [c for c in fig.axes[0].collections]
    assert len(boxes) == 16  # 2 ranks x (4 F + 4 B)
    html = pipeline_animation_html(tl, frames=3)
    assert "<script" in html and "Animation" in html


def test_metrics_table_lists_predicted_and_measured() -> None:
    text = metrics_table({"gpipe m=4": {"bubble_fraction_predicted": 0.2,
                                        "bubble_fraction": 0.25}},
                         ["bubble_fraction_predicted", "bubble_fraction"])
    assert "0.200" in text and "0.250" in text and "gpipe m=4" in text


def test_widget_rebuilds_the_plan_and_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Controls rebuild the plan; invalid choices show the rule; the button runs it on the
    runner; once it has run, every valid change reruns it (at once here: no event loop)."""
    from labkit.lessons import pipeline as lab
    from labkit.widgets.pipeline import PipelinePanel

    warm = object()
    panel = PipelinePanel(stages=2, microbatches=4, schedule="gpipe", runner=warm)
    assert panel.plan is not None and panel.plan.schedule == "gpipe"
    calls: list[dict[str, object]] = []

    def fake_run(schedule: str, stages: int, micro: int, **kw: object) -> object:
        calls.append({"schedule": schedule, "stages": stages, "micro": micro,
                      "virtual": kw.get("virtual"), "runner": kw.get("runner")})
        return SimpleNamespace(metrics={"bubble_fraction_predicted": 0.1,
                                        "bubble_fraction": 0.2}, timeline=_fake_run())

    monkeypatch.setattr(lab, "run_pipeline", fake_run)
    panel.schedule.value = "interleaved"
    panel.microbatches.value = 3
    assert panel.plan is None and calls == []  # 3 is not a multiple of 2; nothing ran yet
    panel.microbatches.value = 4
    assert panel.plan.virtual == 2 and calls == []
    panel.run_button.click()
    assert calls == [{"schedule": "interleaved", "stages": 2, "micro": 4, "virtual": 2,
                      "runner": warm}]
    assert panel.result is not None and "measured <b>0.200</b>" in panel.status.value
    panel.microbatches.value = 8  # live: reruns with the new plan
    assert calls[-1]["micro"] == 8 and len(calls) == 2
    panel.microbatches.value = 5  # not allowed for interleaved: no run
    assert len(calls) == 2
    panel.live.value = False
    panel.microbatches.value = 6
    assert len(calls) == 2
