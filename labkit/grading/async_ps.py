"""Problem set 6 (asynchronous training and Ray): visible cases, answer formats, shape checks.

Lessons 11 and 12 as three functions a grader can try on hidden cases:

* ``may_read(clock, clocks, staleness) -> bool``: the SSP gate of labkit's parameter server
  (``labkit.strategies.ps.protocol``; Ho et al. 2013): may a worker at ``clock`` read now,
  given every worker's clock?
* ``straggler_effects(workers, factor) -> {"asp_over_bsp_rate", "asp_max_staleness"}``: the
  lesson's two formulas for one worker ``factor`` times slower than the others;
* ``serializations(program) -> int``: how many times a Ray driver serializes its big payload
  into the object store (the by-value pitfall of lesson 12).

This module holds only what a student may see. Hidden cases and the rules that grade live
on the instructor's side (``solutions/_grading/ps6_async.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from labkit.grading import calls
from labkit.grading.parts import Question

FORBID = ("labkit.strategies", "labkit.lessons", "labkit.launchers.ray", "labkit.theory",
          "labkit.grading")
"""The gate and the formulas live in labkit's parameter server: write them yourself."""

SEED_GATE_CASES: list[tuple[int, list[int], int]] = [
    (3, [3, 3, 3], 0), (4, [4, 3, 3], 0), (4, [4, 3, 3], 1), (5, [5, 2, 4], 2),
    (6, [6, 4, 5], 2)]
"""Visible (clock, clocks, staleness) cases of Q1: the asking worker's clock, every
worker's clock (its own included), and SSP's s."""
SEED_STRAGGLERS: list[tuple[int, float]] = [(2, 4.0), (3, 2.0)]
"""Visible (workers, factor) cases of Q2: lesson 11 ran 2 workers, one 4x slower."""
SEED_PROGRAMS: dict[str, list[Any]] = {
    "16 tasks by value": [("loop", 16, [("task_value",)])],
    "put once, 16 tasks by reference": [("put",), ("loop", 16, [("task_ref",)])],
    "put inside the loop": [("loop", 16, [("put",), ("task_ref",)])],
}
"""Visible programs of Q3 (lesson 12's 20 MB payload and 16 tasks)."""
STEPS = ("put", "task_value", "task_ref", "loop")


def read_bool(value: Any) -> bool | str:
    if type(value) is not bool:
        return f"return True or False, not {value!r}"
    return value


def read_effects(value: Any) -> dict[str, float] | str:
    keys = ("asp_over_bsp_rate", "asp_max_staleness")
    if not isinstance(value, dict) or any(k not in value for k in keys):
        return f"return a dict with keys {', '.join(keys)}, not {value!r}"
    out = {}
    for k in keys:
        v = value[k]
        if isinstance(v, bool) or not isinstance(v, int | float):
            return f"'{k}' must be a number, not {v!r}"
        out[k] = float(v)
    return out


def read_count(value: Any) -> int | str:
    if type(value) is not int or value < 0:
        return f"return a count (an int >= 0), not {value!r}"
    return value


def _shape(q: Question, label: str, fn: Callable[..., Any], args: tuple[Any, ...],
           reader: Callable[[Any], Any]) -> None:
    if calls.answer(q, label, fn, args, forbid=FORBID, reader=reader, gate=True) is not None:
        q.record(label, True, gate=True)


GATE_PARTS = ["grants within s clocks of the slowest", "refuses more than s clocks ahead",
              "s = 0 waits like BSP"]
"""Q1's parts (the instructor's key records each case under one of them)."""


def gate_question(fn: Callable[..., Any], points: float = 3) -> Question:
    """Q1: answers of the right type on the visible cases; right or wrong at grading."""
    q = Question("may_read", points, GATE_PARTS)
    for clock, clocks, staleness in SEED_GATE_CASES:
        _shape(q, "True or False for each case", fn, (clock, list(clocks), staleness),
               read_bool)
    return q


def straggler_question(fn: Callable[..., Any], points: float = 3) -> Question:
    """Q2: the shape on the visible cases; the formulas at grading."""
    q = Question("straggler_effects", points, ["ASP / BSP gradients per second",
                                               "ASP's largest staleness"])
    for workers, factor in SEED_STRAGGLERS:
        _shape(q, "both numbers for each case", fn, (workers, factor), read_effects)
    return q


def program_question(fn: Callable[..., Any], points: float = 2) -> Question:
    """Q3: a count for each visible program; the counts at grading."""
    q = Question("serializations", points, ["by value", "by reference",
                                            "a put inside a loop"])
    for program in SEED_PROGRAMS.values():
        _shape(q, "a count for each program", fn, (list(program),), read_count)
    return q
