"""Problem set 5's rules (instructor side): the memory count part by part, the layout's rules.

A count that forgets what tensor parallelism copies fails only that part; a count that
calls ``labkit.theory`` scores nothing; a layout that ignores the budget, the node or the
traffic loses exactly those parts. The real run is in tests/distributed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from labkit.grading import instructor, layout3d
from labkit.grading.layout3d import SEED_LAYOUT
from tests.support.answers import model_answers

pytestmark = pytest.mark.lesson09
REPO = Path(__file__).resolve().parents[2]
GRADER = instructor.load("ps5_3d", REPO)


SOLUTION = model_answers("ps5_3d")


@pytest.mark.parametrize("student", ["", "alice", "stray"])
def test_the_model_answers_score_full_marks_without_the_run(student: str) -> None:
    q = layout3d.state_question(SOLUTION["state_bytes"])
    GRADER.check_state(q, SOLUTION["state_bytes"], student)
    assert q.earned == q.points, q.feedback()
    q = layout3d.layout_question(SOLUTION["choose_layout"])
    GRADER.check_layout(q, SOLUTION["choose_layout"], student, real_run=False)
    assert [p.label for p in q.parts.values() if not p.passed] == [
        "the real run fits and equals one process"]


def test_state_counts_match_the_measured_lesson_numbers() -> None:
    """pp 2 x tp 2 of the lesson GPT: 58,560 parameters on the fullest rank, 12 B each."""
    lay = {"dp": 1, "pp": 2, "tp": 2, "zero_stage": 0}
    assert GRADER.predict(SEED_LAYOUT, lay).max_memory() == 702_720 == 12 * 58_560
    assert SOLUTION["state_bytes"](SEED_LAYOUT, lay) == 702_720


def test_forgetting_the_copied_layernorms_fails_only_the_tensor_parallel_part() -> None:
    right = SOLUTION["state_bytes"]

    def no_copies(scenario: dict, layout: dict) -> float:
        if layout["tp"] == 1 or layout["zero_stage"]:
            return right(scenario, layout)  # type: ignore[no-any-return]
        h, tp = scenario["model"]["width"], layout["tp"]
        per_block_error = 6 * h - 6 * h // tp  # treats the copied 6h as split too
        blocks = -(-scenario["model"]["depth"] // layout["pp"])
        per = sum(scenario["bytes_per_param"].values())
        return right(scenario, layout) - blocks * per_block_error * per  # type: ignore[no-any-return]

    q = layout3d.state_question(no_copies)
    GRADER.check_state(q, no_copies)
    failed = [p.label for p in q.parts.values() if not p.passed]
    assert failed == ["tensor-parallel slices"], q.feedback()
    assert "6h LayerNorm" in q.feedback() and 0 < q.earned < q.points


def test_calling_theory_for_the_count_scores_nothing() -> None:
    def by_theory(scenario: dict, layout: dict) -> float:
        from labkit import theory

        m = scenario["model"]
        return theory.parallel_layout(kind="gpt", width=m["width"], depth=m["depth"],
                                      heads=m["heads"], seq_len=m["seq_len"], vocab=m["vocab"],
                                      dp=layout["dp"], pp=layout["pp"], tp=layout["tp"],
                                      zero_stage=layout["zero_stage"],
                                      optimizer="momentum").max_memory()

    q = layout3d.state_question(by_theory)
    GRADER.check_state(q, by_theory)
    assert q.earned == 0 and "labkit.theory" in q.feedback()


def test_plain_data_parallelism_breaks_the_budget_and_sends_more() -> None:
    def all_data(scenario: dict) -> dict:
        return {"dp": scenario["world_size"], "pp": 1, "tp": 1, "zero_stage": 0}

    q = layout3d.layout_question(all_data)
    GRADER.check_layout(q, all_data, real_run=False)
    assert q.parts["a factorisation the model allows"].passed
    assert q.parts["tensor parallelism inside a node"].passed
    assert not q.parts["fits the budget (predicted)"].passed
    assert not q.parts["the fewest bytes on the wire among layouts that fit"].passed
    assert "over the budget" in q.feedback()


def test_tensor_parallelism_across_nodes_and_a_wrong_world_are_named() -> None:
    def wide_tp(scenario: dict) -> dict:
        return {"dp": 1, "pp": 1, "tp": scenario["world_size"], "zero_stage": 0}

    q = layout3d.layout_question(wide_tp)
    GRADER.check_layout(q, wide_tp, real_run=False)
    assert not q.parts["tensor parallelism inside a node"].passed  # hidden: 2 ranks per node
    assert "inside a node" in q.feedback()

    def eight(scenario: dict) -> dict:
        return {"dp": 8, "pp": 1, "tp": 1, "zero_stage": 3}

    q = layout3d.layout_question(eight)
    assert not q.parts["a factorisation the model allows"].passed
    assert "the world has 4 ranks" in q.feedback()


@pytest.mark.parametrize("value, problem", [
    ([1, 2, 2, 0], "return a dict"), ({"dp": 1, "pp": 2, "tp": 2}, "lacks zero_stage"),
    ({"dp": 1, "pp": 2.0, "tp": 2, "zero_stage": 0}, "'pp' must be an int"),
    ({"dp": 1, "pp": 2, "tp": 2, "zero_stage": 4}, "zero_stage 0..3")])
def test_a_malformed_layout_is_explained(value: Any, problem: str) -> None:
    got = layout3d.read_layout(value)
    assert isinstance(got, str) and problem in got


@pytest.mark.parametrize("student", ["alice", "bob", "stray"])
def test_every_hidden_scenario_has_a_layout_that_fits_and_one_that_does_not(student: str
                                                                            ) -> None:
    for scenario in [SEED_LAYOUT, *GRADER.hidden_layouts(student).values()]:
        least, best = GRADER.fewest_bytes(scenario)
        assert least > 0 and GRADER.predict(scenario, best).max_memory() <= scenario["budget_bytes"]
        assert any(GRADER.predict(scenario, lay).max_memory() > scenario["budget_bytes"]
                   for lay in GRADER.admissible(scenario))


def test_hidden_cases_are_drawn_per_student_and_their_answers_never_shown() -> None:
    """Issue 35 item 8: other students get other models and budgets; a wrong count or a
    wasteful layout hears its own numbers, never the expected count or the least traffic."""
    assert GRADER.hidden_state("alice") == GRADER.hidden_state("alice")
    assert GRADER.hidden_state("alice") != GRADER.hidden_state("bob")
    assert GRADER.hidden_layouts("alice") != GRADER.hidden_layouts("bob")
    right = SOLUTION["state_bytes"]
    seed_cases = [dict(lay) for lay in layout3d.SEED_STATE_CASES.values()]

    def off(scenario: dict, layout: dict) -> float:
        seen = scenario == SEED_LAYOUT and layout in seed_cases
        return right(scenario, layout) * (1 if seen else 1.5)  # type: ignore[no-any-return]

    q = layout3d.state_question(off)
    GRADER.check_state(q, off, "alice")
    hidden = [c for line in q.feedback().splitlines() for c in line.split(" | ")
              if "hidden model" in c]
    assert hidden and all("(hidden case)" in c and "expected" not in c for c in hidden)

    def all_data(scenario: dict) -> dict:
        return {"dp": scenario["world_size"], "pp": 1, "tp": 1, "zero_stage": 3}

    q = layout3d.layout_question(all_data)
    GRADER.check_layout(q, all_data, "alice", real_run=False)
    for label, scenario in GRADER.hidden_layouts("alice").items():
        least = f"{GRADER.fewest_bytes(scenario)[0]:,.0f}"
        assert least not in q.feedback(), (label, q.feedback())
