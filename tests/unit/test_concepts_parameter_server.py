"""Lesson 11's diagram of the parameter server: what it draws, read back from the Figure."""

from __future__ import annotations

import pytest
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
from matplotlib.text import Text

from labkit.visuals.concepts.parameter_server import plot_parameter_server, server_bytes_per_step


def _texts(fig) -> list[str]:
    return [t.get_text() for t in fig.findobj(Text) if t.get_text()]


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_one_server_box_w_worker_boxes_and_a_push_and_a_pull_arrow_per_worker(workers):
    """A box for the server and one per worker; per worker one push arrow (towards the
    server: it ends higher than it starts) and one pull arrow (away from it), each labelled."""
    fig = plot_parameter_server(workers=workers, params=22_026, batch_per_worker=256, lr=0.4)
    ax = fig.axes[0]
    boxes = [p for p in ax.patches if isinstance(p, FancyBboxPatch)]
    arrows = [p for p in ax.patches if isinstance(p, FancyArrowPatch)]
    assert len(boxes) == workers + 1
    texts = _texts(fig)
    assert sum(t == "server (rank 0)" for t in texts) == 1
    assert [t for t in texts if t.startswith("worker ")] == [
        f"worker {k} (rank {k})" for k in range(1, workers + 1)]
    assert len(arrows) == 2 * workers
    assert sorted(a.get_label() for a in arrows) == ["pull"] * workers + ["push"] * workers
    for a in arrows:  # the pushes climb to the server (drawn on top), the pulls come down
        (_, y0), (_, y1) = a._posA_posB
        assert (y1 > y0) == (a.get_label() == "push"), a.get_label()
    assert sorted(t for t in texts if "push" in t and t.startswith("2.")) == sorted(
        f"2. push g_{k}" for k in range(1, workers + 1))
    assert sum(t == "4. pull w" for t in texts) == workers


def test_the_lessons_numbers_are_printed_the_server_update_and_one_message_in_bytes():
    """The model's parameters and one message's bytes (22,026 fp32 numbers = 88.1 KB), the
    batch shard, and the server's averaged SGD step over W = 2 gradients."""
    texts = "\n".join(_texts(plot_parameter_server(workers=2, params=22_026,
                                                   batch_per_worker=256, lr=0.4)))
    assert "22,026 parameters" in texts and "88.1 KB" in texts
    assert "256 samples" in texts
    assert "w <- w - 0.4 x (g_1 + ... + g_2) / 2" in texts


def test_server_bytes_per_step_is_w_pushes_plus_w_pulls_of_the_whole_model():
    """Li et al. 2014: every worker pushes its whole gradient and pulls the whole model, so
    a 2 GB model and 8 workers put 32 GB through one server per step (the quiz's ps-04)."""
    assert server_bytes_per_step(8, 500_000_000) == 32_000_000_000
    assert server_bytes_per_step(2, 22_026) == 4 * 22_026 * 4


def test_bad_sizes_are_refused_with_the_values_named():
    with pytest.raises(ValueError, match=r"workers \(0\)"):
        plot_parameter_server(workers=0, params=10, batch_per_worker=1, lr=0.1)
