"""Question types for the quick test: how a question is written and how it is drawn.

Two kinds of question exist:

* multiple choice (``Kind.CHOICE``): the choices are shuffled per attempt; an answer is
  a letter (``"b"``, ``"B)"``), the choice's text, or both (``"B) all-reduce"``);
* numeric (``Kind.NUMERIC``): the numbers in the prompt are drawn per attempt from a
  small grid by a seeded RNG, and the answer key is *computed* by ``labkit.theory``.

How answers are read and the numeric tolerance (1%) are in ``labkit.quiz.answers``.
``Item.check`` never raises: an answer that cannot be read scores 0 with a message.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from labkit.base.errors import LabError
from labkit.quiz.answers import (
    LETTERS,
    AnswerFormatError,
    numbers_match,
    parse_choice,
    parse_number,
)


class QuizError(LabError, ValueError):
    """An answer sheet or a request to the quiz broke a rule (unknown id, wrong shape)."""


class Kind(str, Enum):
    """How a question is answered."""

    CHOICE = "choice"
    NUMERIC = "numeric"


class Concept(str, Enum):
    """The concepts the quiz covers; each attempt spreads over as many as it can."""

    DATA_PARALLEL = "data-parallel"
    COLLECTIVES = "collectives"
    SYNC_ASYNC = "sync-vs-async"
    BATCH_LR = "batch-lr-scaling"
    MIXED_PRECISION = "mixed-precision"
    MEMORY_ZERO = "memory-zero"
    PIPELINE = "pipeline"
    TENSOR_PARALLEL = "tensor-parallel"
    COMMUNICATION = "communication"
    FAULT_TOLERANCE = "fault-tolerance"
    SCALING = "scaling"
    THREE_D = "3d-parallelism"
    MULTI_NODE = "multi-node"
    PARAMETER_SERVER = "parameter-server"
    RAY = "ray"
    LONG_SEQUENCES = "long-sequences"

    @property
    def label(self) -> str:
        """A human-readable name, e.g. "Pipeline parallelism and bubbles"."""
        return _LABELS[self]


_LABELS = {
    Concept.DATA_PARALLEL: "Data parallelism",
    Concept.COLLECTIVES: "All-reduce and collectives",
    Concept.SYNC_ASYNC: "Synchronous vs asynchronous SGD",
    Concept.BATCH_LR: "Batch size, LR scaling and warmup",
    Concept.MIXED_PRECISION: "Mixed precision",
    Concept.MEMORY_ZERO: "Memory and ZeRO sharding",
    Concept.PIPELINE: "Pipeline parallelism and bubbles",
    Concept.TENSOR_PARALLEL: "Tensor parallelism",
    Concept.COMMUNICATION: "Interconnects and overlap",
    Concept.FAULT_TOLERANCE: "Checkpointing and fault tolerance",
    Concept.SCALING: "Amdahl's law and scaling",
    Concept.THREE_D: "3D parallelism",
    Concept.MULTI_NODE: "Across nodes: links and hierarchy",
    Concept.PARAMETER_SERVER: "Parameter servers and consistency",
    Concept.RAY: "Ray: tasks, actors, object store",
    Concept.LONG_SEQUENCES: "Long sequences and many experts",
}

LESSONS = ("00_welcome", "01_data_parallelism", "02_batch_size_and_lr",
           "03_pipeline_parallelism", "04_tensor_parallelism", "05_memory_and_zero",
           "06_communication", "07_fault_tolerance", "09_3d_parallelism", "10_multi_node",
           "11_async_training", "12_ray", "13_laptop_to_cluster",
           "14_long_sequences_and_experts")
"""Lesson ids the bank is tagged with: the stems of the notebooks under ``notebooks/`` (08 is
the quiz itself); 09-12 are the lessons on 3D parallelism, the multi-node link, parameter
servers (sync vs async SGD) and Ray; 13 the planner at scale; 14 the lesson on long sequences and many
experts."""

CONCEPT_LESSON = {
    Concept.DATA_PARALLEL: "01_data_parallelism", Concept.COLLECTIVES: "01_data_parallelism",
    Concept.SCALING: "01_data_parallelism", Concept.SYNC_ASYNC: "11_async_training",
    Concept.BATCH_LR: "02_batch_size_and_lr", Concept.PIPELINE: "03_pipeline_parallelism",
    Concept.TENSOR_PARALLEL: "04_tensor_parallelism", Concept.MEMORY_ZERO: "05_memory_and_zero",
    Concept.MIXED_PRECISION: "05_memory_and_zero", Concept.COMMUNICATION: "06_communication",
    Concept.FAULT_TOLERANCE: "07_fault_tolerance", Concept.THREE_D: "09_3d_parallelism",
    Concept.MULTI_NODE: "10_multi_node", Concept.PARAMETER_SERVER: "11_async_training",
    Concept.RAY: "12_ray", Concept.LONG_SEQUENCES: "14_long_sequences_and_experts",
}
"""The lesson a question belongs to unless it names its own (``lesson=``)."""


def _lesson_of(question: Any) -> str:
    lesson = question.lesson or CONCEPT_LESSON[question.concept]
    if lesson not in LESSONS:
        raise QuizError(f"question {question.id}: lesson {lesson!r} is not one of {LESSONS}")
    return lesson


def format_number(x: float) -> str:
    """Show a key the way a student would write it: ``1024``, ``0.004``, ``1.5e-05``."""
    if float(x).is_integer() and abs(x) < 1e15:
        return str(int(x))
    return f"{x:.4g}"


# ---------------------------------------------------------------- drawn questions


@dataclass(frozen=True)
class Result:
    """How one answer scored; ``message`` says why an answer could not be read."""

    id: str
    concept: Concept
    correct: bool
    given: str
    expected: str
    explanation: str
    message: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "concept": self.concept.value, "correct": self.correct,
                "given": self.given, "expected": self.expected,
                "explanation": self.explanation, "message": self.message}


@dataclass(frozen=True)
class Item:
    """One question as drawn for an attempt: concrete numbers, shuffled choices, the key."""

    id: str
    concept: Concept
    kind: Kind
    prompt: str
    explanation: str
    choices: tuple[str, ...] = ()
    answer_index: int | None = None
    """Index into ``choices`` of the right one (choice questions)."""
    answer_value: float | None = None
    """The key computed by ``labkit.theory`` (numeric questions)."""
    unit: str = ""
    integer: bool = False
    params: Mapping[str, Any] = field(default_factory=dict)
    lesson: str = ""

    @property
    def expected(self) -> str:
        if self.kind is Kind.CHOICE:
            assert self.answer_index is not None
            return f"{LETTERS[self.answer_index]}) {self.choices[self.answer_index]}"
        assert self.answer_value is not None
        text = format_number(self.answer_value)
        if not self.unit:
            return text
        return f"{text}{self.unit}" if self.unit == "x" else f"{text} {self.unit}"

    @property
    def hint(self) -> str:
        """How to write the answer, shown next to the prompt."""
        if self.kind is Kind.CHOICE:
            return f"a letter, {LETTERS[0]} to {LETTERS[len(self.choices) - 1]}"
        if self.integer:
            return f"a whole number of {self.unit}" if self.unit else "a whole number"
        what = "a speedup factor, e.g. 3.5" if self.unit == "x" else (
            f"a number in {self.unit}" if self.unit else "a number, e.g. 0.004, 4e-3 or 1/250")
        return f"{what}; within 1% counts"

    @property
    def model_answer(self) -> str:
        """A correct answer as a student would type it: the letter, or the number."""
        if self.kind is Kind.CHOICE:
            assert self.answer_index is not None
            return LETTERS[self.answer_index]
        return repr(self.answer_value)

    def public(self) -> dict[str, Any]:
        """What a student may see before answering (never the key)."""
        return {"id": self.id, "concept": self.concept.value, "kind": self.kind.value,
                "lesson": self.lesson, "prompt": self.prompt, "choices": list(self.choices),
                "unit": self.unit or None}

    def check(self, given: object) -> Result:
        """Score one answer; never raises: an unreadable answer scores 0 with a message."""
        shown = "" if given is None else str(given).strip()
        try:
            correct = self._is_correct(given)
            message = None
        except AnswerFormatError as exc:
            correct, message = False, str(exc)
        return Result(self.id, self.concept, correct, shown, self.expected,
                      self.explanation, message)

    def _is_correct(self, given: object) -> bool:
        if given is None or str(given).strip() == "":
            raise AnswerFormatError("no answer given")
        if self.kind is Kind.NUMERIC:
            assert self.answer_value is not None
            return numbers_match(parse_number(given, self.unit), self.answer_value,
                                 integer=self.integer)
        return parse_choice(str(given), self.choices) == self.answer_index


# ---------------------------------------------------------------- question definitions


@dataclass(frozen=True)
class ChoiceQuestion:
    """A multiple-choice question: one right answer, the rest plausible mistakes."""

    id: str
    concept: Concept
    prompt: str
    correct: str
    wrong: tuple[str, ...]
    explanation: str
    lesson: str = ""
    """The lesson id (``LESSONS``); empty: the concept's lesson (``CONCEPT_LESSON``)."""
    kind: Kind = field(default=Kind.CHOICE, init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lesson", _lesson_of(self))

    def draw(self, rng: random.Random) -> Item:
        choices = [self.correct, *self.wrong]
        rng.shuffle(choices)
        return Item(self.id, self.concept, Kind.CHOICE, self.prompt, self.explanation,
                    choices=tuple(choices), answer_index=choices.index(self.correct),
                    lesson=self.lesson)


@dataclass(frozen=True)
class NumericQuestion:
    """A parametrised question whose key ``compute(**params)`` comes from labkit.theory.

    ``prompt`` and ``explanation`` are ``str.format`` templates over the parameters, the
    values ``derive(**params)`` returns, and ``answer`` (the key, formatted).
    """

    id: str
    concept: Concept
    prompt: str
    grid: Mapping[str, Sequence[Any]]
    compute: Callable[..., float]
    explanation: str
    unit: str = ""
    integer: bool = False
    valid: Callable[..., bool] | None = None
    derive: Callable[..., Mapping[str, Any]] | None = None
    worked: Mapping[str, Any] | None = None
    """The seed page's worked example, when this question has one; always in the grid."""
    lesson: str = ""
    """The lesson id (``LESSONS``); empty: the concept's lesson (``CONCEPT_LESSON``)."""
    kind: Kind = field(default=Kind.NUMERIC, init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lesson", _lesson_of(self))

    def sample(self, rng: random.Random) -> dict[str, Any]:
        """Pick one value per grid axis, retrying until ``valid`` accepts the combination."""
        for _ in range(1000):
            params = {k: rng.choice(list(v)) for k, v in self.grid.items()}
            if self.valid is None or self.valid(**params):
                return params
        raise QuizError(f"question {self.id}: no valid parameters in its grid")

    def draw(self, rng: random.Random) -> Item:
        return self.render(self.sample(rng))

    def render(self, params: Mapping[str, Any]) -> Item:
        """The question for one fixed set of parameters (used by draw and by tests)."""
        value = float(self.compute(**params))
        extra = dict(self.derive(**params)) if self.derive else {}
        ctx = {**params, **extra, "answer": format_number(value)}
        return Item(self.id, self.concept, Kind.NUMERIC, self.prompt.format(**ctx),
                    self.explanation.format(**ctx), answer_value=value, unit=self.unit,
                    integer=self.integer, params=dict(params), lesson=self.lesson)


Question = ChoiceQuestion | NumericQuestion
