"""Lesson 02's sentences under its LR table are read from the table's own final losses
(``labkit.lessons.scaling_text``): each comparison follows the numbers, whichever way they go."""

from __future__ import annotations

import math

from labkit.lessons.scaling import CurveRun
from labkit.lessons.scaling_text import reading


def _run(name: str, losses: list[float], lr: float = 0.8) -> CurveRun:
    return CurveRun(name=name, world_size=4, global_batch=64, lr=lr, losses=losses,
                    lrs=[lr] * len(losses), grad_norms=[1.0] * len(losses), wall_s=1.0)


def _runs(unscaled: float, linear: float, warm: float, big: list[float], clipped: list[float]):
    flat = [2.3] * 7
    return {r.name: r for r in (
        _run("1 rank", flat + [1.0], lr=0.2), _run("4 ranks, LR unscaled", flat + [unscaled]),
        _run("4 ranks, linear scaling", flat + [linear]),
        _run("4 ranks, linear + warmup", flat + [warm]),
        _run("4 ranks, LR x16 too large", big, lr=12.8),
        _run("4 ranks, LR x16 + clipping", clipped, lr=12.8))}


def test_the_sentences_follow_the_losses_the_table_shows() -> None:
    text = reading(_runs(1.6, 1.05, 1.1, [2.3, 40.0, math.nan] + [math.nan] * 5,
                         [2.3] * 7 + [2.0]))
    assert "'4 ranks, LR unscaled' lags behind '1 rank': final loss 1.600 against 1.000 (+60%)" in text
    assert "'4 ranks, linear scaling' lands close to '1 rank'" in text
    assert "'4 ranks, LR x16 too large' blew up: its loss was not a number from step 2 on" in text
    assert "'4 ranks, LR x16 + clipping' stayed finite at LR 12.8: final loss 2.000" in text
    assert "final loss 2.000; it lags behind '1 rank'." in text  # its name once, not twice
    assert "Warmup costs 0.050 in final loss here (1.100 with it, 1.050 without)." in text


def test_a_run_that_contradicts_the_usual_story_is_told_as_it_is() -> None:
    """Unscaled ends below the single rank, the large LR stays finite, warmup saves: the
    sentences say so instead of repeating the textbook."""
    text = reading(_runs(0.5, 1.4, 1.2, [2.3] * 7 + [2.1], [2.3] * 7 + [2.2]))
    assert "'4 ranks, LR unscaled' ends below '1 rank'" in text
    assert "'4 ranks, linear scaling' lags behind '1 rank'" in text
    assert "'4 ranks, LR x16 too large' stayed finite" in text
    assert "Warmup saves 0.200" in text
    assert "blew up" not in text
