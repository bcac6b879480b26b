"""Problem set 6's rules (instructor side): the SSP gate, the straggler formulas, the
by-value pitfall; each wrong answer loses exactly its part, a call into labkit scores 0."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from labkit.grading import async_ps, instructor

pytestmark = pytest.mark.lesson11
REPO = Path(__file__).resolve().parents[2]
GRADER = instructor.load("ps6_async", REPO)


def solution() -> dict[str, Any]:
    """The model answers, executed from the solution notebook."""
    nb = json.loads((REPO / "solutions/ps6_async/ps6_async.ipynb").read_text())
    ns: dict[str, Any] = {}
    for cell in nb["cells"]:
        gid = cell["metadata"].get("nbgrader", {}).get("grade_id", "")
        if gid == "ps6_setup" or gid.endswith("_answer"):
            exec("".join(cell["source"]), ns)  # our own notebook
    return ns


SOLUTION = solution()
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
    """The key is labkit's own Gate. At version 5 with a read of version 3 in flight, a new
    read lets that gradient end up (5 - 3) + 1 = 3 updates stale: granted under K = 3, not
    under K = 2. K = 0 grants a read only when nothing is in flight."""
    assert GRADER.expected_gate(5, [3], 3) and not GRADER.expected_gate(5, [3], 2)
    assert GRADER.expected_gate(4, [], 0) and not GRADER.expected_gate(4, [4], 0)


def test_an_asp_gate_fails_only_the_refusals() -> None:
    q = grade("may_read", lambda version, in_flight, bound: True)
    failed = {p.label for p in q.parts.values() if not p.passed}
    assert failed == {"refuses a read that could end up too stale",
                      "K = 0 keeps one gradient in flight"}, q.feedback()
    assert "could end up" in q.feedback() and 0 < q.earned < q.points


def test_forgetting_the_others_in_flight_fails_the_refusals() -> None:
    def only_age(version: int, in_flight: list, bound: int) -> bool:
        return version - min(in_flight, default=version) <= bound

    q = grade("may_read", only_age)
    assert not q.parts["refuses a read that could end up too stale"].passed
    assert q.parts["grants what the bound allows"].passed


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
