"""exercises/ is exactly what `nbgrader generate_assignment` makes from solutions/ today."""

from __future__ import annotations

import pytest

from labkit.grading import course

pytestmark = [pytest.mark.grading, pytest.mark.lesson08]


def test_committed_release_matches_a_fresh_generation() -> None:
    stale = course.stale_assignments()
    assert stale == {}, f"exercises/ is stale, run `labkit course release`: {stale}"


def test_release_has_no_solutions_or_hidden_tests() -> None:
    root = course.repo_root()
    for name in course.assignments(root):
        for nb in (root / "exercises" / name).glob("*.ipynb"):
            text = nb.read_text()
            assert "BEGIN SOLUTION" not in text and "BEGIN HIDDEN TESTS" not in text, nb
            assert "raise NotImplementedError" in text, nb
