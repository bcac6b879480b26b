"""Lesson 01's strong-scaling verdict (``labkit.lessons.dp_verdicts.speedup_verdict``): the
table's speedup (medians of alternated repeats) judged with the spread of the repeats'
pair-by-pair ratios, so two busy runs cannot read "holds" and "contradicted" for one machine
(the issue: Amdahl's f was 0.000 in one run and 0.798 in the other)."""

from __future__ import annotations

from types import SimpleNamespace

from labkit.lessons.dp_verdicts import speedup_verdict


def _amdahl(one: list[float], two: list[float]) -> SimpleNamespace:
    med = lambda xs: sorted(xs)[(len(xs) - 1) // 2]
    return SimpleNamespace(step_times={1: med(one), 2: med(two)}, repeats={1: one, 2: two})


def test_steady_repeats_hold_and_the_value_is_the_tables() -> None:
    v = speedup_verdict(_amdahl([0.060, 0.062, 0.061], [0.040, 0.041, 0.040]))
    assert v.word == "holds" and v.sample.value == 0.061 / 0.040
    assert "speedup t_1 / t_2 1.52 +-" in v.sentence()


def test_repeats_that_swing_across_one_are_inconclusive_not_a_verdict_either_way() -> None:
    v = speedup_verdict(_amdahl([0.060, 0.090, 0.061], [0.050, 0.045, 0.080]))
    assert v.word == "inconclusive", v.sentence()


def test_one_run_each_takes_the_single_run_noise() -> None:
    v = speedup_verdict(_amdahl([0.060], [0.058]))
    assert v.word == "inconclusive" and "+- 0.10" in v.sentence()  # 1.03 +- 10 %
