"""Problem set 1's keys (instructor side) reproduce the seeds, and the package ships none.

The keys and hidden inputs live in ``solutions/_grading/ps1_numbers.py``; the public
``labkit.grading.numeric`` holds only the seeds' printed answers for the visible cases.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from labkit.grading import instructor, numeric

pytestmark = pytest.mark.lesson08
REPO = Path(__file__).resolve().parents[2]
GRADER = instructor.load("ps1_numbers", REPO)
FUNCTIONS = {"global_batch": "global_batch_size", "target_lr": "target_lr",
             "warmup_lr": "warmup_lr", "adam_gb_per_gpu": "adam_gb_per_gpu",
             "bubble_share": "bubble_share", "ring_bytes": "ring_bytes",
             "ring_time": "ring_time"}


def solutions() -> dict[str, object]:
    """The model answers of the source notebook, defined here as a student would."""
    import nbformat

    nb = nbformat.read(REPO / "solutions/ps1_numbers/ps1_numbers.ipynb", as_version=4)
    ns: dict[str, object] = {}
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("solution"):
            exec(cell.source, ns)
    return ns


def test_seed_000_exercise_1_numbers() -> None:
    """Seed 000: 'Global batch: 1024; Target LR: 0.004; LR at step 250: 0.002'."""
    assert GRADER.key_global_batch(8, 32, 4) == 1024
    assert math.isclose(GRADER.key_target_lr(0.001, 256, 8, 32, 4), 0.004)
    assert math.isclose(GRADER.key_warmup_lr(0.004, 250, 500), 0.002)


def test_seed_000_memory_and_zero_paper_numbers() -> None:
    """3B mixed Adam on 4 GPUs: 48 / 16.5 / 12 GB; ZeRO paper 7.5B on 64: 120, 31.4, 16.6, 1.9."""
    assert [GRADER.key_adam_gb_per_gpu(3e9, 4, s) for s in (0, 2, 3)] == [48.0, 16.5, 12.0]
    got = [GRADER.key_adam_gb_per_gpu(7.5e9, 64, s) for s in range(4)]
    for g, want in zip(got, (120.0, 31.4, 16.6, 1.9)):
        assert math.isclose(g, want, rel_tol=0.02)  # the paper rounds to 0.1 GB


@pytest.mark.parametrize("name", sorted(numeric.SEED_CASES))
def test_visible_answers_are_the_keys(name: str) -> None:
    """The literal answers shipped for the worked examples equal the instructor's keys."""
    for kwargs, printed in numeric.SEED_CASES[name]:
        assert math.isclose(GRADER.KEYS[name](**kwargs), printed, rel_tol=1e-9), kwargs


@pytest.mark.parametrize("name", sorted(numeric.PARTS))
def test_solution_gets_full_marks_and_hidden_cases_reach_every_part(name: str) -> None:
    q = numeric.question(name, solutions()[FUNCTIONS[name]])
    q.check(GRADER.cases(name))
    assert all(p.ran for p in q.parts.values()), q.feedback()
    assert q.earned == q.points, q.feedback()


def test_a_call_into_labkit_theory_scores_zero_with_a_message() -> None:
    """Item 2: the answer key is labkit.theory; a function that calls it earns nothing."""
    from labkit import theory

    def lazy(gpus: int, per_gpu_batch: int, accumulation: int) -> int:
        return theory.global_batch(per_gpu_batch, gpus, accumulation)

    q = numeric.question("global_batch", lazy)
    q.check(GRADER.cases("global_batch"))
    assert q.earned == 0
    assert "labkit.theory.batch.global_batch" in q.feedback()
    assert "do that work yourself" in q.feedback()


@pytest.mark.parametrize("name", sorted(numeric.PARTS))
def test_every_students_hidden_cases_reach_every_part(name: str) -> None:
    """A part no hidden case reaches earns nothing: before the fix, 25 random draws missed
    bubble_share's "fewer microbatches than stages" for about one student in 22 (a class
    test's honest student scored 13 / 14). Every id of a large sample reaches every part."""
    for student in [f"student{i}" for i in range(2000)] + ["lkddcabes0"]:  # lkddcabes0 missed
        drawn = [kwargs for kwargs, _ in GRADER.cases(name, student)]
        for label, rule in numeric.PARTS[name]:
            assert any(rule(**kwargs) for kwargs in drawn), (student, label)


def test_hidden_cases_are_seeded() -> None:
    assert GRADER.cases("bubble_share", 5) == GRADER.cases("bubble_share", 5)
