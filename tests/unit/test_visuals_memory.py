"""Lesson 05 figures return Figures holding the expected bars, curves and spans."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.patches import Rectangle

from labkit.analysis.timeline import Timeline
from labkit.base.events import Event, Lane, Op
from labkit.visuals.memory import plot_memory_bars, plot_memory_vs_dp, plot_zero_timeline

pytestmark = pytest.mark.lesson05


def _metrics(ranks: int, shard: int) -> dict:
    return {"per_rank_bytes": [{"params": 400, "grads": 400 // shard, "optimizer": 800 // shard}
                               for _ in range(ranks)],
            "predicted_bytes": {"params": 400.0, "grads": 400.0 / shard,
                                "optimizer": 800.0 / shard},
            "saved_activation_bytes": [100] * ranks, "predicted_activation_bytes": 90.0}


def test_memory_bars_fill_measured_and_outline_predicted() -> None:
    fig = plot_memory_bars({"stage 0": _metrics(2, 1), "stage 2": _metrics(2, 2)}, unit=1.0)
    bars = [p for p in fig.axes[0].patches if isinstance(p, Rectangle)]
    filled = [b for b in bars if b.get_fill()]
    outlines = [b for b in bars if not b.get_fill()]
    assert len(filled) == len(outlines) == 2 * 2 * 4  # runs x ranks x terms
    # stage 2, rank 0: the grads bar sits on top of params and is 200 high
    grads = [b for b in filled if b.get_height() == 200 and b.get_y() == 400]
    assert grads
    assert max(b.get_y() + b.get_height() for b in outlines) == pytest.approx(400 + 400 + 800 + 90)


def test_memory_vs_dp_has_one_curve_per_stage_and_measured_points() -> None:
    fig = plot_memory_vs_dp(7.5e9, (1, 64), measured=[(3, 64, 1.875e9)])
    lines = fig.axes[0].get_lines()
    curves = [ln for ln in lines if len(ln.get_xdata()) == 2]
    assert len(curves) == 4
    assert curves[0].get_ydata()[0] == pytest.approx(120.0)
    assert curves[3].get_ydata()[1] == pytest.approx(1.875)
    assert any(list(ln.get_xdata()) == [64] for ln in lines)


def test_zero_timeline_draws_the_chosen_step() -> None:
    evs = [Event(0, Lane.STEP, Op.STEP, 0, 100, step=1),
           Event(0, Lane.COMM, Op.ALL_GATHER, 0, 10, step=1, name="AG0f"),
           Event(0, Lane.COMPUTE, Op.FORWARD, 10, 10, step=1, name="F0"),
           Event(0, Lane.COMM, Op.REDUCE_SCATTER, 50, 10, step=1, name="RS0"),
           Event(0, Lane.COMPUTE, Op.FORWARD, 200, 10, step=2, name="F0")]
    fig = plot_zero_timeline(Timeline(evs, 1), step=1)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts == ["AG0f", "F0", "RS0"]


def test_memory_table_lists_measured_and_predicted_per_rank() -> None:
    from labkit.visuals.memory import memory_table

    text = memory_table({"stage 2": _metrics(2, 2) | {"comm_ratio_vs_ddp": 1.0}}, unit=1.0)
    rows = text.splitlines()[2:]
    assert len(rows) == 2
    assert "400.00|400.00" in rows[0] and "200.00|200.00" in rows[0]
    assert "100.00|90.00" in rows[1]
