"""The quiz's question bank: every question, tagged by concept, with a stable id.

Questions live in ``bank_*.py`` files grouped by concept; each is tagged with the lesson
it belongs to (``questions.LESSONS``). This module gathers them and checks the bank once
at import (unique ids, every concept and every lesson present, worked examples inside
their question's grid), so a broken question fails loudly in tests rather than in class.
Ids are stable: progress files and answer sheets refer to them, so never reuse an id for
a different question; add new ones with the next number.
"""

from __future__ import annotations

from collections import Counter

from labkit.quiz import (
    bank_async,
    bank_batch,
    bank_comm,
    bank_lessons,
    bank_memory,
    bank_parallel,
    bank_plan,
    bank_sequence,
    bank_systems,
)
from labkit.quiz.questions import LESSONS, Concept, Kind, NumericQuestion, Question, QuizError

BANK: tuple[Question, ...] = tuple(
    bank_batch.QUESTIONS + bank_memory.QUESTIONS + bank_parallel.QUESTIONS
    + bank_comm.QUESTIONS + bank_lessons.QUESTIONS + bank_systems.QUESTIONS
    + bank_async.QUESTIONS + bank_sequence.QUESTIONS
    + bank_plan.QUESTIONS)


def _check(bank: tuple[Question, ...]) -> None:
    problems: list[str] = []
    dupes = [qid for qid, n in Counter(q.id for q in bank).items() if n > 1]
    if dupes:
        problems.append(f"duplicate question ids {dupes}")
    missing = [c.value for c in Concept if not any(q.concept is c for q in bank)]
    if missing:
        problems.append(f"no question for concept(s) {missing}")
    untaught = [lesson for lesson in LESSONS if not any(q.lesson == lesson for q in bank)]
    if untaught:
        problems.append(f"no question for lesson(s) {untaught}")
    for q in bank:
        if isinstance(q, NumericQuestion) and q.worked is not None:
            outside = [k for k, v in q.worked.items() if v not in q.grid.get(k, ())]
            if outside or set(q.worked) != set(q.grid):
                problems.append(f"{q.id}: worked example {dict(q.worked)} is not in its grid")
        elif not isinstance(q, NumericQuestion) and q.correct in q.wrong:
            problems.append(f"{q.id}: the right answer is also listed as wrong")
    if problems:
        raise QuizError("; ".join(problems))


_check(BANK)


def questions(concept: Concept | str | None = None,
              kind: Kind | str | None = None) -> list[Question]:
    """Questions in the bank, optionally only one concept and/or one kind."""
    c = Concept(concept) if concept is not None else None
    k = Kind(kind) if kind is not None else None
    return [q for q in BANK if (c is None or q.concept is c) and (k is None or q.kind is k)]


def by_lesson() -> dict[str, int]:
    """Question counts per lesson id (``LESSONS``)."""
    return {lesson: sum(q.lesson == lesson for q in BANK) for lesson in LESSONS}


def bank_summary() -> dict[str, dict[str, int]]:
    """Question counts per concept: ``{concept: {"choice": n, "numeric": m, "total": n+m}}``."""
    out: dict[str, dict[str, int]] = {}
    for c in Concept:
        qs = questions(c)
        out[c.value] = {"choice": sum(q.kind is Kind.CHOICE for q in qs),
                        "numeric": sum(q.kind is Kind.NUMERIC for q in qs), "total": len(qs)}
    return out
