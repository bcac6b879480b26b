"""Check helpers: answers become plain numbers before any comparison; feedback says what to try."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from labkit.grading import numeric
from labkit.grading.checks import NotANumber, as_number, as_tensor, check_function, check_number

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.lesson08


class AlwaysEqual:
    """A cheating answer: equal to everything."""

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__


class SneakyFloat(float):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = float.__hash__


def test_always_equal_object_scores_zero() -> None:
    """An object whose __eq__ always says True is not a number and fails the check."""
    verdict = check_number("global batch", AlwaysEqual(), 1024)
    assert not verdict.passed
    assert "must be a number" in verdict.feedback


def test_float_subclass_with_lying_eq_is_compared_by_value() -> None:
    assert not check_number("x", SneakyFloat(3.0), 1024).passed
    assert check_number("x", SneakyFloat(1024.0), 1024).passed


def test_as_number_accepts_numpy_and_torch_scalars_rejects_bool_and_strings() -> None:
    assert as_number(np.float32(0.5)) == 0.5
    assert as_number(torch.tensor(3)) == 3.0
    assert type(as_number(np.int64(4))) is float
    for bad in (True, "1024", None, [1], torch.ones(2)):
        with pytest.raises(NotANumber):
            as_number(bad)


def test_as_tensor_strips_subclasses_and_copies() -> None:
    class Lying(torch.Tensor):
        pass

    t = torch.arange(3.0).as_subclass(Lying)
    out = as_tensor(t)
    assert type(out) is torch.Tensor and out.data_ptr() != t.data_ptr()
    with pytest.raises(TypeError):
        as_tensor([1.0, 2.0])


def test_wrong_answer_feedback_names_the_call_and_says_what_to_try() -> None:
    verdict = check_function("bubble_share", lambda stages, microbatches: (stages - 1) / microbatches,
                             [({"stages": 4, "microbatches": 8}, 3 / 11)], hint="use (p-1)/(m+p-1)")
    assert not verdict.passed
    assert "bubble_share(stages=4, microbatches=8)" in verdict.feedback
    assert "Try: use (p-1)/(m+p-1)" in verdict.feedback


def test_stub_gets_not_implemented_feedback() -> None:
    def stub(**kw: object) -> float:
        raise NotImplementedError

    q = numeric.question("global_batch", stub)
    assert q.earned == 0 and "not implemented" in q.feedback()


def test_hardcoded_seed_answer_passes_visible_fails_hidden() -> None:
    """Returning the worked example's number is caught by the randomised hidden variants."""
    from labkit.grading import instructor

    grader = instructor.load("ps1_numbers", REPO)

    def cheat(gpus: int, per_gpu_batch: int, accumulation: int) -> int:
        return 1024 if (gpus, per_gpu_batch, accumulation) == (8, 32, 4) else 512

    q = numeric.question("global_batch", cheat)
    assert q.passed  # the worked examples alone
    q.check(grader.cases("global_batch"))
    assert q.earned == 0  # every part also holds hidden cases
    assert "expected" not in q.feedback()  # hidden keys are never shown


def test_a_dead_graders_empty_box_cgroups_are_swept(tmp_path, monkeypatch):
    """A grader stopped mid-grading (SIGTERM, a killed test run) left its boxes' cgroups
    behind; the next box sweeps the empty ones whose grader is gone, never a live grader's or
    one that still holds a process."""
    from labkit.grading.sandbox import limits

    live, dead = 111, 222
    monkeypatch.setattr(limits, "_alive", lambda pid: pid == live)
    (tmp_path / f"labkit-box-{dead}-0a1b2c3d").mkdir()
    (tmp_path / f"labkit-box-{live}-0a1b2c3d").mkdir()
    busy = tmp_path / f"labkit-box-{dead}-ffffffff"
    busy.mkdir()
    (busy / "cgroup.procs").write_text("4242\n")  # stands in for a folder rmdir refuses
    (tmp_path / "someone-else").mkdir()
    assert limits.sweep_dead_boxes(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"labkit-box-{live}-0a1b2c3d", f"labkit-box-{dead}-ffffffff", "someone-else"]
