"""The mini challenge's real run: the student's batch and LR ratios on the lab's model.

Seed 000's scenario at 8x the base batch: the LR left unscaled barely trains in the
sample budget (the seed's "quietly underfits"); scaled linearly with a warmup, it does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.grading import instructor
from labkit.grading.reasoning import SEED_CHALLENGE

pytestmark = [pytest.mark.distributed, pytest.mark.grading, pytest.mark.lesson08]
GRADER = instructor.load("ps4_reasoning", Path(__file__).resolve().parents[2])
EIGHT_X = {"parallelism": "ddp", "per_gpu_batch": 32, "accumulation": 2, "lr": 1e-4,
           "lr_rule": "linear", "warmup_steps": 0, "precision": "bf16", "loss_scaling": False,
           "overlap": True}


def test_unscaled_lr_fails_the_real_run_and_linear_scaling_with_warmup_passes() -> None:
    got = GRADER.lab_runs(SEED_CHALLENGE, {
        "unscaled": EIGHT_X, "scaled": {**EIGHT_X, "lr": 8e-4, "warmup_steps": 200}})
    assert not got["unscaled"][0] and "8x the batch" in got["unscaled"][1]
    assert got["scaled"][0], got["scaled"][1]
