"""Problem set 6's rules (instructor side): the SSP gate (clocks, Ho et al. 2013), the
straggler formulas, the by-value pitfall; each wrong answer loses exactly its part, a call
into labkit scores 0."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from labkit.grading import async_ps, instructor
from tests.support.answers import model_answers

pytestmark = pytest.mark.lesson11
REPO = Path(__file__).resolve().parents[2]
GRADER = instructor.load("ps6_async", REPO)


SOLUTION = model_answers("ps6_async")
QUESTIONS = {"may_read": (async_ps.gate_question, GRADER.check_gate),
             "straggler_effects": (async_ps.straggler_question, GRADER.check_stragglers),
             "serializations": (async_ps.program_question, GRADER.check_programs)}


def grade(name: str, fn: Any) -> Any:
    make, check = QUESTIONS[name]
    q = make(fn)
    check(q, fn)
    return q


@pytest.mark.parametrize("name", QUESTIONS)
def test_the_model_answers_score_full_marks(name: str) -> None:
    q = grade(name, SOLUTION[name])
    assert q.earned == q.points, q.feedback()


def test_the_gate_matches_labkits_parameter_server() -> None:
    """The key is labkit's own SSP Gate (Ho et al. 2013): a worker at clock 5 with the
    slowest at 3 is 2 clocks ahead: granted under s = 2, not under s = 1. s = 0 grants only
    when every worker is at the reader's clock, as BSP."""
    assert GRADER.expected_gate(5, [5, 3, 4], 2) and not GRADER.expected_gate(5, [5, 3, 4], 1)
    assert GRADER.expected_gate(4, [4, 4], 0) and not GRADER.expected_gate(4, [4, 3], 0)


def test_an_asp_gate_fails_only_the_refusals() -> None:
    q = grade("may_read", lambda clock, clocks, staleness: True)
    failed = {p.label for p in q.parts.values() if not p.passed}
    assert failed == {"refuses more than s clocks ahead", "s = 0 waits like BSP"}, q.feedback()
    assert "clock(s) ahead" in q.feedback() and 0 < q.earned < q.points


def test_the_old_update_count_rule_fails_the_clock_cases() -> None:
    """Bounded delay (the rule labkit called "ssp" before issue 25) is not SSP: counting
    the reads in flight instead of clocks fails the refusals."""
    def updates(clock: int, clocks: list, staleness: int) -> bool:
        return sum(1 for c in clocks if c == clock) - 1 <= staleness

    q = grade("may_read", updates)
    assert not q.parts["refuses more than s clocks ahead"].passed


def test_an_off_by_one_bound_fails_the_edge_cases() -> None:
    q = grade("may_read", lambda clock, clocks, staleness: min(clocks) > clock - staleness)
    assert not q.parts["grants within s clocks of the slowest"].passed


def test_a_staleness_off_by_one_loses_that_part_only() -> None:
    def off(workers: int, factor: float) -> dict:
        return {"asp_over_bsp_rate": ((workers - 1) * factor + 1) / workers,
                "asp_max_staleness": workers * factor}

    q = grade("straggler_effects", off)
    assert [p.label for p in q.parts.values() if not p.passed] == ["ASP's largest staleness"]


def test_counting_puts_once_misses_the_pitfall() -> None:
    def puts_once(program: list) -> int:
        flat = json.dumps(program)
        return flat.count("task_value") * 16 + (1 if "put" in flat else 0)

    q = grade("serializations", puts_once)
    assert not q.parts["a put inside a loop"].passed
    assert "ray.put serializes it once" in q.feedback()


def test_calling_labkit_scores_nothing() -> None:
    def by_labkit(workers: int, factor: float) -> dict:
        from labkit.strategies.ps import protocol  # a forbidden module

        gate = protocol.Gate(protocol.Consistency.ASP, workers)
        return {"asp_over_bsp_rate": float(gate.workers), "asp_max_staleness": 0.0}

    q = grade("straggler_effects", by_labkit)
    assert q.earned == 0 and "labkit.strategies" in q.feedback()


@pytest.mark.parametrize("value, reader, problem", [
    ("yes", async_ps.read_bool, "True or False"),
    ({"asp_over_bsp_rate": 1.0}, async_ps.read_effects, "asp_max_staleness"),
    (2.0, async_ps.read_count, "an int >= 0")])
def test_a_malformed_answer_is_explained(value: Any, reader: Any, problem: str) -> None:
    got = reader(value)
    assert isinstance(got, str) and problem in got


def test_hidden_cases_are_drawn_per_student_and_their_answers_never_shown() -> None:
    """Issue 35 item 8: a classmate's hidden cases are other cases, and a wrong answer to
    every case gets feedback that gives no hidden case's expected value."""
    for draw in (GRADER.hidden_gate_cases, GRADER.hidden_stragglers, GRADER.hidden_programs):
        assert draw("alice") == draw("alice") != draw("bob")
    student = "alice"

    def wrong_gate(clock: int, clocks: list, staleness: int) -> bool:
        return clock - min(clocks) > staleness  # SSP's answer, negated

    q = async_ps.gate_question(wrong_gate)
    GRADER.check_gate(q, wrong_gate, student)
    text = q.feedback()
    assert "hidden case" in text and "disagrees with SSP" in text, text
    assert not any(f"clocks {clocks}" in text
                   for _, clocks, _ in GRADER.hidden_gate_cases(student))

    def wrong_stragglers(workers: int, factor: float) -> dict:
        right = (workers, factor) in async_ps.SEED_STRAGGLERS  # the visible ones only
        return {"asp_over_bsp_rate": ((workers - 1) * factor + 1) / workers if right else 0.5,
                "asp_max_staleness": (workers - 1) * factor if right else 0.5}

    q = async_ps.straggler_question(wrong_stragglers)
    GRADER.check_stragglers(q, wrong_stragglers, student)
    hidden = [case for line in q.feedback().splitlines() for case in line.split(" | ")
              if any(f"{w} workers, one {f:g}x" in case
                     for w, f in GRADER.hidden_stragglers(student))]
    assert hidden and not any("expected" in case for case in hidden), q.feedback()

    def serialized(steps: list) -> int:
        return sum(s[1] * serialized(s[2]) if s[0] == "loop" else s[0] != "task_ref"
                   for s in steps)

    def wrong_programs(program: list) -> int:
        seen = [json.loads(json.dumps(p)) for p in async_ps.SEED_PROGRAMS.values()]
        return serialized(program) if program in seen else 10_000

    q = async_ps.program_question(wrong_programs)
    GRADER.check_programs(q, wrong_programs, student)
    hidden = [case for line in q.feedback().splitlines() for case in line.split(" | ")
              if "hidden program" in case]
    assert hidden and not any(f"serialized {GRADER.count(p)} times" in case for case in hidden
                              for p in GRADER.hidden_programs(student).values()), hidden
