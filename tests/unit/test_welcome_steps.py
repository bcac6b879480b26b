"""Lesson 00's reading of its own run: which steps are past warm-up (drawn and averaged), and
how far "equal to one process" can be in float32. No processes: hand-made timelines."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from labkit.analysis.timeline import Timeline
from labkit.base.events import Event, Lane, Op
from labkit.lessons import welcome

MS = 1_000_000


def _timeline(compute_ms: list[float], ranks: int = 2) -> Timeline:
    """One backward span of the given length per step on every rank."""
    events = []
    for r in range(ranks):
        for s, ms in enumerate(compute_ms):
            t = s * 100 * MS
            events.append(Event(r, Lane.COMPUTE, Op.BACKWARD, t, int(ms * MS), step=s))
            events.append(Event(r, Lane.STEP, Op.STEP, t, 90 * MS, step=s))
    return Timeline(events, ranks)


def test_warm_up_steps_are_not_drawn() -> None:
    """Lesson 00's case: steps 0 and 1 cost 16 and 9 ms of compute, later ones about 0.8 ms;
    the first two settled steps are 2 and 3, and every settled step is averaged."""
    tl = _timeline([16.4, 8.7, 0.98, 0.75, 0.81, 0.88, 0.73, 0.84, 0.8, 0.67])
    assert welcome.settled_steps(tl) == [2, 3]
    assert welcome.settled_steps(tl, count=None) == [2, 3, 4, 5, 6, 7, 8, 9]
    text = welcome.steps_text(tl, [2, 3])
    assert "step 0 16.40 ms (20x), step 1 8.70 ms (11x) paid warm-up" in text
    assert text.endswith("drawn: step 2 0.98 ms, step 3 0.75 ms")


def test_a_slow_step_in_the_middle_is_skipped_for_a_consecutive_pair() -> None:
    """A late outlier (a busy moment) is not drawn: the first consecutive settled pair is."""
    tl = _timeline([5.0, 1.0, 4.0, 1.1, 1.0, 0.9])
    assert welcome.settled_steps(tl) == [3, 4]
    text = welcome.steps_text(tl, [3, 4])
    assert "step 0 5.00 ms (5x) paid warm-up; step 2 4.00 ms (4x) ran slow (a busy moment)" in text


def test_a_run_without_warm_up_draws_steps_1_and_2() -> None:
    tl = _timeline([1.0, 1.0, 1.1, 0.9])
    assert welcome.settled_steps(tl) == [1, 2]
    assert "no step paid warm-up" in welcome.steps_text(tl, [1, 2])


def test_step_split_averages_only_the_settled_steps() -> None:
    """welcome_text's compute per step reads the settled steps: step 1's 9 ms of warm-up does
    not make a 1 ms step read as 3.7 ms."""
    run = SimpleNamespace(timeline=_timeline([20.0, 9.0, 1.0, 1.0]),
                          config=SimpleNamespace(world_size=2, optimizer="sgd", lr=0.05, steps=4),
                          metrics={})
    assert welcome.welcome_text(run).startswith("2 ranks: compute 1.0 ms")


@pytest.mark.parametrize("x", [0.18, 0.177, 1.0, 0.5, 3.0, -0.2, 1e-5])
def test_float32_step_is_numpys_spacing_of_float32(x: float) -> None:
    """One float step at x, as numpy defines it for float32 (np.spacing)."""
    assert welcome.float32_step(x) == float(np.spacing(np.float32(abs(x))))


def test_rounding_gap_of_the_default_mlp_is_one_float_step_under_1_over_sqrt_32() -> None:
    """in_dim 32: the largest weights sit under 1/sqrt(32) = 0.177, where float32 steps by
    2**-26 = 1.49e-8 (rounding.py measured 1.5e-8 after 10 SGD steps on 2 ranks)."""
    cfg = SimpleNamespace(model=SimpleNamespace(in_dim=32, width=128))
    assert welcome.rounding_gap(cfg) == 2.0 ** -26
    with pytest.raises(ValueError, match="finite non-zero"):
        welcome.float32_step(0.0)
