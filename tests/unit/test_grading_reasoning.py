"""Problem set 4's rules (instructor side) accept every defensible answer and reject the rest.

Q1: the seed's three scenarios have the seed's answers (and (b) accepts both sharded and
model parallelism); Q2: the lab's models fail the naive configuration of seed 000's mini
challenge and pass each single lever; Q3: the analysis names the cause of every recorded
trace, public and hidden, from the trace's numbers alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.grading import instructor, reasoning
from labkit.grading.parts import Question
from tests.support.answers import model_answers

pytestmark = pytest.mark.lesson08
REPO = Path(__file__).resolve().parents[2]
GRADER = instructor.load("ps4_reasoning", REPO)
NAIVE = {"parallelism": "ddp", "per_gpu_batch": 32, "accumulation": 1, "lr": 4e-4,
         "lr_rule": "linear", "warmup_steps": 0, "precision": "fp32", "loss_scaling": False,
         "overlap": False}


def test_seed_003_level_one_answers_and_every_defensible_pairing() -> None:
    got = {k: GRADER.defensible(s)[:2] for k, s in reasoning.SEED_SCENARIOS.items()}
    assert got == {"a": ({"data"}, "slow"), "b": ({"sharded", "model"}, "fits"),
                   "c": ({"none"}, "slow")}
    assert "640 GB" in GRADER.defensible(reasoning.SEED_SCENARIOS["b"])[2]  # 40e9 x 16 B


def test_level_one_explains_an_indefensible_answer_and_scores_parts() -> None:
    def always_data(scenario: dict) -> dict:
        return {"approach": "data", "fact": "slow"}

    q = reasoning.strategy_question(always_data)
    GRADER.check_strategies(q, always_data)
    assert q.parts["(a) ResNet"].passed and not q.parts["(b) 40B transformer"].passed
    assert "does not fit" in q.feedback() and 0 < q.earned < q.points


def test_mini_challenge_needs_a_lever_by_the_lab_model() -> None:
    seed = reasoning.SEED_CHALLENGE
    assert GRADER.predicted_speedup(seed, NAIVE) < 2 <= min(
        GRADER.predicted_speedup(seed, {**NAIVE, **lever})
        for lever in ({"precision": "bf16"}, {"overlap": True}, {"accumulation": 2}))
    assert GRADER.lr_problem(seed, NAIVE) and "warm it up" in GRADER.lr_problem(seed, NAIVE)
    assert GRADER.lr_problem(seed, {**NAIVE, "warmup_steps": 300}) is None
    assert "linear rule gives lr 0.0004" in GRADER.lr_problem(seed, {**NAIVE, "lr": 1e-4})


def test_mini_challenge_memory_rule_needs_zero_for_7b() -> None:
    def plain_ddp(challenge: dict) -> dict:
        return {**NAIVE, "per_gpu_batch": 8, "lr": 8e-4, "warmup_steps": 100, "precision": "bf16"}

    q = Question("propose", 4)
    GRADER.check_challenge(q, plain_ddp, "alice", real_run=False)
    assert not q.parts["fits in memory"].passed and "would need" in q.feedback()


@pytest.mark.parametrize("name", [*GRADER.PUBLIC_TRACES, *GRADER.HIDDEN_TRACES])
def test_analysis_recovers_the_injected_cause_of_every_trace(name: str) -> None:
    specs = {**GRADER.PUBLIC_TRACES, **GRADER.HIDDEN_TRACES}
    kind, rank, _, _ = specs[name]
    assert GRADER.analyze(GRADER.load_trace(name)) == (kind, rank)


def test_a_wrong_lever_or_rank_costs_its_part_only() -> None:
    def guesses(timeline: object) -> dict:
        return {"kind": "slow_stage", "rank": 0, "lever": "more_microbatches"}

    q = reasoning.diagnosis_question(guesses, REPO / "solutions/ps4_reasoning/traces")
    GRADER.check_diagnoses(q, guesses)
    assert q.parts["a diagnosis of each example"].passed
    assert not q.parts["a lever that fixes it"].passed
    assert "more_microbatches' does not remove a slow_stage" in q.feedback()
    assert q.earned == 0  # kind right on the slow stages only, rank and lever never


def test_traces_carry_no_label() -> None:
    import json

    for folder in (REPO / "solutions/ps4_reasoning/traces", REPO / "solutions/_grading/ps4_traces"):
        for path in folder.glob("*.json"):
            data = json.loads(path.read_text())
            assert data["meta"] == {} and "slow" not in path.read_text()


@pytest.mark.parametrize("student", ["", "alice", "bob", "stray"])
def test_hidden_cases_are_drawn_per_student_and_the_model_answers_meet_them(student: str
                                                                           ) -> None:
    """Issue 35 item 8: each student's scenarios and challenges are their own, and the
    solution scores full marks on every draw (the real run aside)."""
    assert GRADER.hidden_scenarios(student) != GRADER.hidden_scenarios(student + "x")
    assert GRADER.hidden_challenges(student) != GRADER.hidden_challenges(student + "x")
    ns = model_answers("ps4_reasoning")
    q = reasoning.strategy_question(ns["choose_strategy"])
    GRADER.check_strategies(q, ns["choose_strategy"], student)
    assert q.earned == q.points, q.feedback()
    q = reasoning.challenge_question(ns["propose"])
    GRADER.check_challenge(q, ns["propose"], student, real_run=False)
    assert [p.label for p in q.parts.values() if not p.passed] == [
        "stable in a real run on this machine"], q.feedback()


def test_a_hidden_cases_feedback_names_no_answer() -> None:
    """A wrong approach or LR on a hidden case hears the inputs and the rule: not which
    approach, which fact or which LR would have been right."""
    def wrong(scenario: dict) -> dict:
        return {"approach": "model", "fact": "slow"}

    q = reasoning.strategy_question(wrong)
    GRADER.check_strategies(q, wrong, "alice")
    hidden = [c for line in q.feedback().splitlines() for c in line.split(" | ")
              if "hidden scenario" in c]
    assert hidden, q.feedback()
    assert not any(word in c for c in hidden for word in ("shard it", "replicate", "one GPU is"))

    def bad_lr(challenge: dict) -> dict:
        return {**model_answers("ps4_reasoning")["propose"](challenge), "lr": 1.0}

    q = reasoning.challenge_question(bad_lr)
    GRADER.check_challenge(q, bad_lr, "alice", real_run=False)
    assert "linear rule gives" not in q.feedback().split("hidden challenge", 1)[-1]


def test_the_model_answer_meets_every_students_challenges() -> None:
    """The hidden challenges of 1,000 students (student2 and student16 among them): before
    the model answer applied the statement's ZeRO-3 factor and overlap rule, about one
    student in 17 lost the speedup part of a challenge that it solved with ZeRO-3."""
    propose = model_answers("ps4_reasoning")["propose"]
    for student in [f"student{i}" for i in range(1000)]:
        for challenge in GRADER.hidden_challenges(student).values():
            cfg = propose(dict(challenge))
            speed = GRADER.predicted_speedup(challenge, cfg)
            assert speed >= challenge["target_speedup"], (student, challenge, cfg, speed)
