"""Lesson 13's pieces without running the lesson: the breakdown figure draws the planner's own
terms, the planner explorer ranks what its planner returns (a stand-in here) and shows bad
input in the widget, and the lesson's sentences follow their numbers."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest

from labkit.lessons import plan_lesson
from labkit.theory.plan import predict
from labkit.theory.plan_models import Training, cluster, get_model
from labkit.theory.plan_terms import Layout
from labkit.visuals.plan import plot_plan_breakdown

pytestmark = pytest.mark.lesson13


def _two() -> dict:
    model, net = get_model("llama3-8b"), cluster("h100-sxm", 8)
    training = Training(global_batch_tokens=64 * 8192)
    return {"DP 8": predict(model, net, training, Layout(8, 1, 1, 1, 8, zero=3)),
            "TP 8": predict(model, net, training, Layout(1, 8, 1, 1, 64))}


def test_breakdown_stacks_each_layouts_terms_and_marks_capacity() -> None:
    preds = _two()
    fig = plot_plan_breakdown(preds)
    mem_ax, time_ax = fig.axes[:2]
    for ax, kind, scale in ((mem_ax, "memory", 1e9), (time_ax, "time", 1.0)):
        for x, q in enumerate(preds.values()):
            bars = [p for p in ax.patches if abs(p.get_x() + p.get_width() / 2 - x) < 1e-9]
            drawn = [p.get_height() for p in bars]
            want = [t.value / scale for t in getattr(q, kind) if t.value > 0]
            assert drawn == pytest.approx(want), (kind, x)
            assert sum(drawn) == pytest.approx(
                (q.memory_bytes / 1e9) if kind == "memory" else q.step_s)
    assert mem_ax.get_lines()[0].get_ydata()[0] == pytest.approx(80.0)
    assert [t.get_text() for t in mem_ax.get_xticklabels()] == ["DP 8", "TP 8"]


class StandInPlanner:
    """Called like ``labkit.theory.plan.plan``; records its calls, answers fixed predictions."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, model, net, training):
        self.calls.append((model.name, model.seq, net.gpus, training.global_batch_tokens))
        return list(_two().values())


def test_explorer_plans_with_its_planner_and_replans_on_click() -> None:
    from labkit.widgets.plan import plan_explorer

    planner = StandInPlanner()
    box = plan_explorer("llama3-8b", "h100-sxm", 8, 4096, 1e6, planner=planner)
    assert planner.calls == [("llama3-8b", 4096, 8, 1e6)]
    controls, table, reasons, view = box.children
    assert table.value.count("<tr>") == 3 and "DP 8 x TP 1 x PP 1" in table.value
    assert reasons.value.startswith("<p>2 shapes")
    gpus_box = controls.children[0].children[2]
    gpus_box.value = 16
    controls.children[1].children[2].click()
    assert planner.calls[-1] == ("llama3-8b", 4096, 16, 1e6)


def test_explorer_shows_bad_input_instead_of_raising() -> None:
    from labkit.widgets.plan import plan_explorer

    box = plan_explorer("llama3-8b", "h100-sxm", 12, 8192, 1e6, planner=StandInPlanner())
    table = box.children[1]
    assert "gpus (12)" in table.value and "per_node" in table.value


def test_losers_text_counts_the_binding_terms() -> None:
    from labkit.widgets.plan import losers_text

    preds = list(_two().values())
    text = losers_text(preds)
    assert text.startswith("2 shapes, ") and "1 x " in text


def test_seed_options_text_says_which_fits_and_which_is_faster() -> None:
    options = plan_lesson.seed_3b_options()
    text = plan_lesson.options_text(options)
    assert "pure DP" in text and "does not fit" in text and text.count("(fits)") == 2
    fast = max((q for q in options.values() if q.fits), key=lambda q: q.tokens_per_s_per_gpu)
    name = next(n for n, q in options.items() if q is fast)
    assert f"Faster: {name}" in text


def test_own_text_reports_the_gap_in_parameters() -> None:
    rows = [{"term": k, "planner_kB": 216.0, "measured_kB": 234.0, "ratio": 216 / 234}
            for k in plan_lesson.STATE_TERMS]
    text = plan_lesson.own_text(rows)
    assert "7.7% below" in text and "4,500 parameters" in text


def test_tp_collectives_predicted_counts_four_per_layer_per_microbatch() -> None:
    lay = plan_lesson.own_layout(1, 2, 2)
    model = plan_lesson.lesson_decoder(vocab=96)
    assert plan_lesson.tp_collectives_predicted(lay, model) == 4 * 2 * 2


def test_explorer_defaults_plan_a_ranked_table_with_the_real_planner() -> None:
    """Lesson 13 opens the explorer with its defaults: they must divide into layouts (a
    batch of 16e6 tokens is 1,953.125 sequences of 8K, which no layout of 1,024 GPUs takes)."""
    from labkit.widgets.plan import TOP, plan_explorer

    table = plan_explorer().children[1].value
    assert "<table" in table and table.count("<tr>") == TOP + 1, table[:300]
