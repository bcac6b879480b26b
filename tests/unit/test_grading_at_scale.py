"""Problem set 7's rules: the planner grades; the model answers score full marks on every
student's hidden scenarios; each wrong answer loses exactly its part; a call into the planner
scores 0; hidden scenarios differ per student and reach every part."""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.grading import at_scale, instructor
from labkit.grading.parts import Question
from tests.support.answers import model_answers

pytestmark = pytest.mark.lesson13
REPO = Path(__file__).resolve().parents[2]
GRADER = instructor.load("ps7_planning_at_scale", REPO)


SOLUTION = model_answers("ps7_planning_at_scale")


def failed(q: Question) -> set[str]:
    return {p.label for p in q.parts.values() if not p.passed}


@pytest.mark.parametrize("student", ["ada", "grace"])
def test_the_model_answers_score_full_marks_on_hidden_scenarios(student: str) -> None:
    for make, grade, name in ((at_scale.state_question, GRADER.grade_state, "state_gb"),
                              (at_scale.mfu_question, GRADER.grade_mfu, "mfu"),
                              (at_scale.plan_question, GRADER.grade_plan, "plan_layout")):
        q = make(SOLUTION[name])
        grade(q, SOLUTION[name], student)
        assert q.earned == q.points, q.feedback()


def test_hidden_scenarios_differ_per_student_and_cover_both_shapes() -> None:
    a, b = GRADER.scenarios("ada"), GRADER.scenarios("grace")
    assert a != b and a == GRADER.scenarios("ada")
    for cases in (GRADER.mfu_cases("ada"), GRADER.state_cases("ada")):
        shapes = {case[0]["model"]["swiglu"] for case in cases}
        assert shapes == {True, False}
    layouts = [lay for _, lay in GRADER.state_cases("ada")]
    assert {lay["zero"] for lay in layouts} == {0, 1, 2, 3}
    assert any(sc["model"]["layers"] % lay["pp"] for sc, lay in GRADER.state_cases("ada"))


def test_forgetting_the_uneven_stage_loses_only_that_part() -> None:
    def floor_stages(scenario: dict, layout: dict) -> float:
        m = scenario["model"]
        fixed = {**m, "layers": m["layers"] // layout["pp"] * layout["pp"]}
        return SOLUTION["state_gb"]({**scenario, "model": fixed}, layout)

    q = at_scale.state_question(floor_stages)
    GRADER.grade_state(q, floor_stages, "ada")
    assert failed(q) == {"uneven stages"}, q.feedback()


def test_an_mfu_that_forgets_gqa_fails_the_llama_part() -> None:
    def mha(scenario: dict, rate: float) -> float:
        m = scenario["model"]
        return SOLUTION["mfu"]({**scenario, "model": {**m, "kv_heads": m["heads"]}}, rate)

    q = at_scale.mfu_question(mha)
    GRADER.grade_mfu(q, mha, "ada")
    assert failed(q) == {"grouped-query attention, SwiGLU"}, q.feedback()


def test_a_layout_that_does_not_fit_and_guessed_numbers_lose_their_parts() -> None:
    def pure_dp(scenario: dict) -> dict:
        return {"dp": scenario["gpus"], "tp": 1, "pp": 1, "micro_batch": 1, "zero": 0,
                "recompute": "none", "memory_gb": 80.0, "mfu": 0.5}

    q = at_scale.plan_question(pure_dp)
    labels = at_scale.PLAN_PARTS
    assert labels[0] not in failed(q) and {labels[1], labels[2], labels[3]} <= failed(q)


def test_calling_the_planner_scores_nothing() -> None:
    def planner(scenario: dict) -> dict:
        from labkit.theory.plan import plan

        model, net, training = at_scale.objects(scenario)
        best = plan(model, net, training)[0]
        lay = best.layout
        return {"dp": lay.dp, "tp": lay.tp, "pp": lay.pp, "micro_batch": lay.micro_batch,
                "zero": lay.zero, "recompute": lay.recompute,
                "memory_gb": best.memory_bytes / 1e9, "mfu": best.mfu}

    q = at_scale.plan_question(planner)
    assert q.earned == 0 and "computes the answer for you" in q.feedback()


def test_a_layout_across_nodes_is_refused_with_the_rule() -> None:
    lay = {"dp": 32, "tp": 16, "pp": 1, "micro_batch": 1, "zero": 0, "recompute": "none"}
    problems = at_scale.plan_problems(at_scale.SEED_SCENARIO, lay)
    assert any("must divide the node" in p for p in problems), problems
