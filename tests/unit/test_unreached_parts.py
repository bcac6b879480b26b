"""At grading, a scored part that no hidden case reached is said, in the feedback and the
instructor's log: it earns nothing, and the answer is not why (ps1 once missed a part for
about one student in 22)."""

from __future__ import annotations

import pytest

from labkit.grading.parts import Question
from labkit.grading.sandbox.execute import GAP, unreached_parts

pytestmark = pytest.mark.lesson08


def question() -> Question:
    q = Question("bubble_share", 2, ["enough microbatches", "fewer microbatches"])
    q.record("enough microbatches", True)
    return q


def test_a_part_no_case_reached_is_named() -> None:
    (line,) = unreached_parts({"q": question()})
    assert "'fewer microbatches' of bubble_share" in line and "not in your answer" in line
    assert line.startswith(GAP) and "limit" not in line  # nothing of the student's stopped


def test_reached_parts_gates_and_earlier_cells_questions_are_not() -> None:
    earlier = question()
    q = Question("ring", 1, ["bytes"])
    q.record("bytes", False, "wrong")
    q.part("built from send/recv", gate=True)  # a gate no case reached costs nothing
    assert unreached_parts({"q": q, "old": earlier, "x": 3}, before=[earlier, 3]) == []
