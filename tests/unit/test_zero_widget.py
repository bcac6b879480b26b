"""The memory explorer builds and its figure shows the calculator's per-GPU bytes."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest

from labkit.theory import fits
from labkit.widgets.memory import memory_explorer, memory_figure

pytestmark = pytest.mark.lesson05


def test_memory_figure_stacks_the_four_terms_against_capacity() -> None:
    report = fits(3e9, gpus=4, gpu_gb=24, stage=3, activation_gb=2.0)
    fig = memory_figure(report)
    widths = [p.get_width() for p in fig.axes[0].patches]
    assert widths == pytest.approx([1.5, 1.5, 9.0, 2.0])
    assert fig.axes[0].get_lines()[0].get_xdata()[0] == pytest.approx(24.0)


def test_memory_explorer_builds_with_the_seed_defaults() -> None:
    box = memory_explorer()
    assert len(box.children) == 2
