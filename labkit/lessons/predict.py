"""Predict, then reveal: the student writes a number before a run; after it, the lesson sets
the guess beside the formula's prediction and the run's measurement.

A prompt cell holds ``my_guess = None`` and a question; the student types a number and runs
the cell. The cell after the run prints ``reveal(my_guess, predicted=..., measured=...)``:
how far the guess was from each, in the quantity's own unit, and which it was closer to. A
guess left at ``None`` is not an error -- the reveal says there was none and shows both
numbers, so the lesson still runs top to bottom (and in the test suite). Pure: no torch.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any


def _fmt(x: float, unit: str) -> str:
    text = f"{x:.3g}"
    return f"{text} {unit}" if unit else text


def reveal(guess: Any, *, predicted: float, measured: float, what: str, unit: str = "",
           close: float = 0.1, measured_by: str = "your run") -> str:
    """The guess beside the prediction and the measurement. ``close`` is the relative gap
    (share of the prediction) under which a guess counts as right; ``measured_by`` names who
    measured (a published run, e.g. "Meta's run (Llama 3 paper, Table 4)")."""
    found = (f"measured {_fmt(measured, unit)}" if math.isfinite(measured) else
             "found none in the range it measured")
    head = f"{what}: the formula predicts {_fmt(predicted, unit)}, {measured_by} {found}"
    if guess is None:
        return head + " (you left the guess empty: type a number in the prompt and run it again)"
    if isinstance(guess, bool) or not isinstance(guess, Real) or not math.isfinite(float(guess)):
        return head + f" (your guess {guess!r} is not a number: type one, e.g. 0.25)"
    g = float(guess)
    scale = max(abs(predicted), 1e-12)
    gap = abs(g - predicted) / scale
    verdict = ("right on the formula" if gap <= close else
               f"{'above' if g > predicted else 'below'} the formula by {gap:.0%}")
    if not math.isfinite(measured):
        return f"{head}; you guessed {_fmt(g, unit)}: {verdict}"
    nearer = "the measurement" if abs(g - measured) < abs(g - predicted) else "the formula"
    return f"{head}; you guessed {_fmt(g, unit)}: {verdict}, nearer {nearer}"
