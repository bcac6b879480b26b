"""Lesson 02's large-batch sentences and figure come from the numbers they are given: the
race's verdict needs every seed past the margin, the noise scale is the paper's estimator
over a window, and the trade-off figure marks each batch where the formula puts it."""

from __future__ import annotations

import pytest

from labkit.lessons.large_batch_text import NoiseScale, Race, race_text, tradeoff_text
from labkit.theory import examples_needed, steps_needed
from labkit.visuals.batch import plot_noise_scale

pytestmark = pytest.mark.lesson02


def _race(lars_big: list[float]) -> Race:
    runs = [{"optimizer": o, "seed": 0, "global_batch": 32, "lr": 1.0, "warmup_steps": 0,
             "losses": [1.0] * 8} for o in ("momentum", "lars")]
    for seed, lars in enumerate(lars_big):
        runs.append({"optimizer": "momentum", "seed": seed, "global_batch": 1024, "lr": 0.1,
                     "warmup_steps": 5, "losses": [1.0] * 8})
        runs.append({"optimizer": "lars", "seed": seed, "global_batch": 1024, "lr": 32.0,
                     "warmup_steps": 5, "losses": [lars] * 8})
    return Race(runs, {"seeds": (0, 1, 2), "small_batch": 32, "big_batch": 1024, "margin": 0.1,
                       "scale": 10.0})


def test_race_holds_only_when_every_seed_clears_the_margin() -> None:
    """One seed inside the margin turns 'holds' into 'not shown', naming that seed."""
    assert _race([0.7, 0.8, 0.6]).lars_wins()
    assert "it holds here" in race_text(_race([0.7, 0.8, 0.6]))
    close = _race([0.7, 0.95, 0.6])
    assert not close.lars_wins()
    text = race_text(close)
    assert "not shown by this run" in text and "seed 1: +0.05" in text


def test_noise_scale_window_uses_the_appendix_estimators() -> None:
    """Norms built from |G|^2 = 0.5 and tr(Sigma) = 50 give B_simple = 100 exactly."""
    g, tr, small, big = 0.5, 50.0, 32, 64
    ns = NoiseScale(small, big, [g + tr / small] * 40, [g + tr / big] * 40, [1.0] * 40)
    assert ns.b_simple() == pytest.approx(100.0)
    assert [round(w[2], 6) for w in ns.windows(20)] == [100.0, 100.0]
    assert "B_noise (measured, late in the run) = 100" in tradeoff_text(100.0, [16, 1024])
    assert "Linear scaling stops paying" in tradeoff_text(100.0, [16, 1024])
    assert "stops" not in tradeoff_text(100.0, [16, 64])


def test_tradeoff_figure_marks_each_batch_on_the_formula() -> None:
    """Right panel: one marker per batch at (E/E_min, S/S_min), labelled with the batch."""
    fig = plot_noise_scale([(10, 2.0, 80.0), (30, 1.0, 150.0)], 200.0, [16, 64, 1024])
    right = fig.axes[1]
    labels = [t.get_text() for t in right.texts]
    assert labels == ["batch 16", "batch 64", "batch 1024"]
    points = [line.get_xydata()[0] for line in right.lines[1:]]
    for b, (x, y) in zip([16, 64, 1024], points, strict=True):
        assert x == pytest.approx(examples_needed(b, 200.0))
        assert y == pytest.approx(steps_needed(b, 200.0))
    assert list(fig.axes[0].lines[0].get_ydata()) == [80.0, 150.0]
