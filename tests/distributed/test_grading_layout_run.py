"""Problem set 5's real run: the student's layout trained on 4 ranks and measured.

A layout that fits the budget by the prediction also fits by the tensors each rank keeps
and equals one process; plain data parallelism is caught by the measurement alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.grading import instructor
from labkit.grading.layout3d import SEED_LAYOUT

pytestmark = [pytest.mark.distributed, pytest.mark.grading, pytest.mark.lesson09]
GRADER = instructor.load("ps5_3d", Path(__file__).resolve().parents[2])


def test_a_fitting_layout_passes_the_run_and_plain_data_parallelism_does_not() -> None:
    ok, why = GRADER.lab_run(SEED_LAYOUT, {"dp": 1, "pp": 2, "tp": 2, "zero_stage": 0})
    assert ok, why
    assert "702,720 bytes" in why  # measured == the lesson's prediction for pp 2 x tp 2
    ok, why = GRADER.lab_run(SEED_LAYOUT, {"dp": 4, "pp": 1, "tp": 1, "zero_stage": 0})
    assert not ok and "2,572,800 bytes" in why and "budget 1,000,000" in why
