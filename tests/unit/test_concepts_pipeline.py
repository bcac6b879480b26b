"""Lesson 03's picture before its first run: what the figure draws, read from its artists."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

from labkit.analysis.plots import COLORS
from labkit.base.errors import ConfigError
from labkit.base.events import Op
from labkit.visuals.concepts.pipeline import plot_pipeline_stages

pytestmark = pytest.mark.lesson03


def _patches(fig: Figure, gid: str) -> list:
    return [p for p in fig.axes[0].patches if p.get_gid() == gid]


def _texts(fig: Figure) -> list[str]:
    return [t.get_text() for t in fig.axes[0].texts] + [fig.axes[0].get_title()]


def test_the_lessons_pipeline_two_stages_of_eight_layers_four_microbatches() -> None:
    """p = 2, 8 layers, m = 4 (the lesson's numbers): two stage boxes named by rank, four
    layers on each, the classifier on the last, four microbatches of 128 rows, and one
    activation arrow forward and one gradient arrow back at the single cut."""
    fig = plot_pipeline_stages(2, 8, 4, batch=512)
    texts = _texts(fig)
    assert len(_patches(fig, "stage")) == 2
    assert len(_patches(fig, "layer")) == 8 and len(_patches(fig, "head")) == 1
    assert len(_patches(fig, "microbatch")) == 4
    assert len(_patches(fig, "activation")) == 1 and len(_patches(fig, "gradient")) == 1
    assert {"rank 0 · stage 0", "rank 1 · stage 1", "layers 1–4",
            "layers 5–8 + classifier"} <= set(texts)
    assert [f"L{k}" for k in range(1, 9)] == [t for t in texts if t.startswith("L")]
    assert any("128 rows each" in t for t in texts)
    assert "m·(p−1) = 4 activations forward and 4 gradients back" in fig.axes[0].get_title()


def test_arrows_use_the_timelines_forward_and_backward_colours() -> None:
    """The activation arrows are drawn in the forward colour of the measured timelines, the
    gradient arrows in the backward colour, so the picture reads like the runs after it."""
    from matplotlib.colors import to_hex

    fig = plot_pipeline_stages(3, 6, 2)
    acts, grads = _patches(fig, "activation"), _patches(fig, "gradient")
    assert len(acts) == len(grads) == 2  # p - 1 cuts
    assert {to_hex(a.get_edgecolor()) for a in acts} == {COLORS[Op.FORWARD].lower()}
    assert {to_hex(g.get_edgecolor()) for g in grads} == {COLORS[Op.BACKWARD].lower()}
    for arrow, forward in ((acts[0], True), (grads[0], False)):
        xs = [x for x, _ in arrow.get_path().vertices if x > 0]  # the tail is vertex 0
        tail_is_left = xs[0] == min(xs)
        assert tail_is_left == forward, (arrow.get_gid(), xs)


def test_uneven_cut_gives_the_first_stages_the_extra_layer() -> None:
    """7 layers over 2 stages: 4 then 3, as ``bounds_by_count`` cuts them."""
    texts = _texts(plot_pipeline_stages(2, 7, 1))
    assert "layers 1–4" in texts and "layers 5–7 + classifier" in texts


@pytest.mark.parametrize("args", [(0, 8, 4), (2, 1, 4), (2, 8, 0)])
def test_bad_counts_name_the_value_and_rule(args: tuple[int, int, int]) -> None:
    with pytest.raises(ConfigError, match="must be"):
        plot_pipeline_stages(*args)
