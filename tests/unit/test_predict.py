"""Predict, then reveal (``labkit.lessons.predict``): the guess set beside the formula and
the run, an empty or odd guess answered in words."""

from __future__ import annotations

import pytest

from labkit.lessons.predict import reveal

pytestmark = pytest.mark.lesson03


def test_a_guess_is_set_beside_the_formula_and_the_run():
    text = reveal(0.11, predicted=1 / 9, measured=0.13, what="bubble at p = 2, m = 8")
    assert text.startswith("bubble at p = 2, m = 8: the formula predicts 0.111, your run "
                           "measured 0.13")
    assert "you guessed 0.11: right on the formula, nearer the formula" in text
    far = reveal(0.5, predicted=0.2, measured=0.3, what="bubble")
    assert "above the formula by 150%, nearer the measurement" in far


@pytest.mark.parametrize("guess, said", [(None, "you left the guess empty"),
                                         ("a lot", "is not a number"),
                                         (True, "is not a number"),
                                         (float("nan"), "is not a number")])
def test_an_empty_or_odd_guess_still_reveals_both_numbers(guess, said):
    text = reveal(guess, predicted=2.0, measured=2.5, what="x", unit="ms")
    assert said in text and "predicts 2 ms" in text and "measured 2.5 ms" in text


def test_a_run_that_found_no_value_says_so_instead_of_nan():
    """Lesson 01's crossover below its smallest batch: no "nan", and no "nearer" to it."""
    text = reveal(30, predicted=41.5, measured=float("nan"), what="crossover")
    assert "your run found none in the range it measured" in text and "nan" not in text
    assert text.endswith("below the formula by 28%")
