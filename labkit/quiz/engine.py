"""The quiz engine: draw a seeded attempt of ten questions and score it.

A quick test checks understanding the way the seed lesson page does: ten short questions
spread over as many concepts as possible, pass at 70% (7/10 passes, 6/10 fails).

Drawing (``Quiz.new_attempt(seed)``), in three phases:
  1. shuffle the concepts and take one per question, so ten questions touch ten
     different concepts (the bank has fifteen);
  2. choose which of those concepts get a numeric question (about 40% when possible);
  3. pick a question per concept, then draw its numbers and choice order from an RNG
     seeded by ``(seed, question id)``.
The same seed gives the same questions, numbers and choice order on every machine
(string seeding of :class:`random.Random` does not depend on hash randomisation).

Scoring never raises on a bad *answer* (it scores 0 with a message, see
``labkit.quiz.answers``); it raises :class:`QuizError` only for a bad *request*: an
unknown question id, or an answer sheet of the wrong shape.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from labkit.quiz.questions import Concept, Item, Kind, Question, QuizError, Result

PASS_PERCENT = 70
"""Pass mark, in percent of an attempt's questions."""

ATTEMPT_SIZE = 10
"""Questions per attempt."""

NUMERIC_SHARE = 0.4
"""Share of an attempt's questions drawn as numeric when the concepts allow it."""


@dataclass
class Attempt:
    """One sitting of the quiz: the drawn items and the answers scored so far."""

    seed: int
    items: tuple[Item, ...]
    pass_percent: int = PASS_PERCENT
    results: dict[str, Result] = field(default_factory=dict)

    @property
    def ids(self) -> list[str]:
        return [it.id for it in self.items]

    def item(self, key: int | str) -> Item:
        """An item by position (0-based) or by question id."""
        if isinstance(key, int):
            if not 0 <= key < len(self.items):
                raise QuizError(f"question number {key} is out of range 0..{len(self.items) - 1}")
            return self.items[key]
        for it in self.items:
            if it.id == key:
                return it
        raise QuizError(f"unknown question id {key!r} for seed {self.seed}; this attempt "
                        f"asks: {', '.join(self.ids)}")

    def answer(self, key: int | str, given: object) -> Result:
        """Score one answer (a later answer to the same question replaces it)."""
        result = self.item(key).check(given)
        self.results[result.id] = result
        return result

    def answer_all(self, answers: Mapping[str, object] | Sequence[object]) -> list[Result]:
        """Score a whole sheet: ``{id: answer}`` or a list in question order.

        Questions the sheet leaves out score 0 ("no answer given").
        """
        if isinstance(answers, Mapping):
            unknown = [k for k in answers if k not in self.ids]
            if unknown:
                raise QuizError(f"unknown question id(s) {', '.join(map(repr, unknown))} for "
                                f"seed {self.seed}; this attempt asks: {', '.join(self.ids)}")
            given = [answers.get(i) for i in self.ids]
        elif isinstance(answers, Sequence) and not isinstance(answers, str):
            if len(answers) != len(self.items):
                raise QuizError(f"the answer list has {len(answers)} entries but the attempt "
                                f"has {len(self.items)} questions; give one answer per "
                                "question, in order (use \"\" to skip one)")
            given = list(answers)
        else:
            raise QuizError("answers must be an object {\"<question id>\": \"<answer>\"} or a "
                            f"list in question order, not {type(answers).__name__}")
        return [self.answer(i, g) for i, g in enumerate(given)]

    @property
    def total(self) -> int:
        return len(self.items)

    @property
    def score(self) -> int:
        return sum(r.correct for r in self.results.values())

    @property
    def percent(self) -> float:
        return round(100.0 * self.score / self.total, 1) if self.total else 0.0

    @property
    def passed(self) -> bool:
        # integers, so 7/10 at 70% passes without a float rounding surprise
        return self.score * 100 >= self.pass_percent * self.total

    @property
    def finished(self) -> bool:
        return len(self.results) == len(self.items)

    def ordered_results(self) -> list[Result]:
        """Results in question order; unanswered questions show as "no answer given"."""
        return [self.results.get(it.id) or it.check(None) for it in self.items]

    def report(self) -> dict[str, Any]:
        """The scored sheet as one JSON-ready object (what ``labkit quiz --json`` prints)."""
        return {"seed": self.seed, "score": self.score, "total": self.total,
                "percent": self.percent, "passed": self.passed,
                "pass_percent": self.pass_percent,
                "results": [r.to_json() for r in self.ordered_results()]}

    def questions_json(self) -> dict[str, Any]:
        """The drawn questions without their keys (``--print-questions --json``)."""
        return {"seed": self.seed, "total": self.total, "pass_percent": self.pass_percent,
                "questions": [it.public() for it in self.items]}


class _ClassOrInstance:
    """Lets ``Quiz.new_attempt(seed)`` work on the class (default bank) and on an instance."""

    def __init__(self, func: Callable[..., Attempt]):
        self.func = func
        self.__doc__ = func.__doc__

    def __get__(self, obj: Quiz | None, cls: type[Quiz]) -> Callable[..., Attempt]:
        target = obj if obj is not None else cls()
        return lambda *a, **kw: self.func(target, *a, **kw)


class Quiz:
    """A question bank plus the rules of an attempt (size, pass mark, numeric share)."""

    def __init__(self, questions: Sequence[Question] | None = None, *,
                 size: int = ATTEMPT_SIZE, pass_percent: int = PASS_PERCENT,
                 numeric_share: float = NUMERIC_SHARE):
        if questions is None:
            from labkit.quiz.bank import BANK
            questions = BANK
        if not questions:
            raise QuizError("the quiz needs at least one question")
        if size < 1:
            raise QuizError(f"size ({size}) must be at least 1")
        if not 0 < pass_percent <= 100:
            raise QuizError(f"pass_percent ({pass_percent}) must be in 1..100, e.g. 70")
        self.questions: tuple[Question, ...] = tuple(questions)
        self.size = min(size, len(self.questions))
        self.pass_percent = pass_percent
        self.numeric_share = numeric_share

    def by_concept(self) -> dict[Concept, list[Question]]:
        out: dict[Concept, list[Question]] = {}
        for q in self.questions:
            out.setdefault(q.concept, []).append(q)
        return out

    def question(self, qid: str) -> Question:
        for q in self.questions:
            if q.id == qid:
                return q
        raise QuizError(f"no question with id {qid!r} in the bank (ids look like "
                        f"{self.questions[0].id!r})")

    @_ClassOrInstance
    def new_attempt(self, seed: int | None = None) -> Attempt:
        """Draw a reproducible attempt; ``seed=None`` picks (and records) a fresh seed."""
        if seed is None:
            seed = random.SystemRandom().randrange(1, 10**6)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise QuizError(f"seed must be an integer, e.g. 42, not {seed!r}")
        rng = random.Random(f"labkit-quiz:{seed}")
        pools = self.by_concept()
        # 1. one concept per question, as many distinct concepts as the size allows
        concepts = sorted(pools, key=lambda c: c.value)
        rng.shuffle(concepts)
        plan = [concepts[i % len(concepts)] for i in range(self.size)]
        # 2. which slots get a numeric question: those whose concept has one
        can_numeric = [i for i, c in enumerate(plan)
                       if any(q.kind is Kind.NUMERIC for q in pools[c])]
        want = min(len(can_numeric), round(self.size * self.numeric_share))
        numeric_slots = set(rng.sample(can_numeric, want))
        # 3. a question per slot, then its own numbers / choice order
        chosen: list[Question] = []
        for i, concept in enumerate(plan):
            kind = Kind.NUMERIC if i in numeric_slots else Kind.CHOICE
            pool = [q for q in pools[concept] if q not in chosen]
            preferred = [q for q in pool if q.kind is kind] or pool
            if not preferred:  # concept exhausted (tiny banks): take any unused question
                preferred = [q for q in self.questions if q not in chosen]
            chosen.append(rng.choice(preferred))
        items = tuple(q.draw(random.Random(f"labkit-quiz:{seed}:{q.id}")) for q in chosen)
        return Attempt(seed=seed, items=items, pass_percent=self.pass_percent)


def new_attempt(seed: int | None = None) -> Attempt:
    """Draw an attempt from the default bank (same as ``Quiz.new_attempt(seed)``)."""
    return Quiz().new_attempt(seed)
