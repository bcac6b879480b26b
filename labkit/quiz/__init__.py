"""The quick test: ten seeded questions over the course's concepts, pass at 70%.

Python: ``Quiz.new_attempt(seed)`` draws an attempt; ``attempt.answer(i, "0.004")`` scores
one answer; ``attempt.report()`` is the scored sheet; ``ProgressStore().record(attempt)``
saves progress under ``$LABKIT_HOME`` (default: ``labkit.base.places.state_dir``).
Notebook: ``labkit.widgets.quiz.quiz_widget()``. Terminal: ``labkit quiz``.
Numeric answers are accepted within 1% (``REL_TOL``); whole-number keys must be exact.
"""

from labkit.quiz.answers import REL_TOL, parse_number
from labkit.quiz.engine import ATTEMPT_SIZE, PASS_PERCENT, Attempt, Quiz, new_attempt
from labkit.quiz.questions import (
    ChoiceQuestion,
    Concept,
    Item,
    Kind,
    NumericQuestion,
    QuizError,
    Result,
)
from labkit.quiz.store import ProgressStore

__all__ = ["ATTEMPT_SIZE", "PASS_PERCENT", "REL_TOL", "Attempt", "ChoiceQuestion", "Concept",
           "Item", "Kind", "NumericQuestion", "ProgressStore", "Quiz", "QuizError", "Result",
           "new_attempt", "parse_number"]
