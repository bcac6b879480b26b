"""Lesson 07's checkpoint-interval figure and sentence: Young's and Daly's intervals for the
measured save cost, the model band over the saves' spread, and the measured points."""

from __future__ import annotations

import pytest

from labkit.lessons.checkpoints import LLAMA3_MTBF_S, interval_text
from labkit.theory import daly_interval, young_interval
from labkit.visuals.faults import plot_checkpoint_interval

pytestmark = pytest.mark.lesson07


def test_figure_marks_both_intervals_and_the_measured_points() -> None:
    saves, step = [0.03, 0.05, 0.2], 0.007
    fig = plot_checkpoint_interval(saves, step, LLAMA3_MTBF_S, measured={2: 3.0, 4: 1.5})
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert f"Young's interval: {young_interval(0.05, LLAMA3_MTBF_S):.1f} s" in labels
    assert f"Daly's interval: {daly_interval(0.05, LLAMA3_MTBF_S):.1f} s" in labels
    points = next(line for line in ax.get_lines() if line.get_label().startswith("measured"))
    assert list(points.get_xdata()) == [2 * step, 4 * step]
    assert list(points.get_ydata()) == [3.0, 1.5]
    assert any("30-200 ms" in label for label in labels)  # the band spans the saves' spread
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"


def test_interval_text_reads_the_median_save_and_says_what_dominates() -> None:
    text = interval_text([0.03, 0.05, 0.2], 0.007, every=4, mtbf_s=3 * 3600)
    assert "a save took 50 ms (median of 3 saves, from 30 to 200 ms)" in text
    assert f"Young's interval sqrt(2 delta M) = {young_interval(0.05, 3 * 3600):.1f} s" in text
    assert "almost all of it saving" in text  # every 4 steps = 28 ms: delta/tau >> tau/2M
