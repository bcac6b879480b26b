"""labkit.theory.batch: global batch, LR scaling rules, warmup and decay schedules."""

from __future__ import annotations

import itertools
import math

import pytest

from labkit.base.errors import ConfigError
from labkit.theory import global_batch, lr_at_step, lr_schedule, scaled_lr, warmup_lr

pytestmark = pytest.mark.lesson02


def test_seed_exercise_global_batch_target_lr_and_warmup() -> None:
    """Seed 000, exercise 1: 8 GPUs x 32 x 4 accumulation; 0.001 at 256; 500-step warmup."""
    batch = global_batch(32, 8, 4)
    target = scaled_lr(0.001, 256, batch)
    assert batch == 1024
    assert target == pytest.approx(0.004)
    assert warmup_lr(target, 250, 500) == pytest.approx(0.002)
    assert lr_at_step(250, target_lr=target, warmup_steps=500) == pytest.approx(0.002)


def test_global_batch_defaults_to_no_accumulation() -> None:
    """Seed 003: eight GPUs at a local batch of 32 train on an effective batch of 256."""
    assert global_batch(32, 8) == 256


def test_sqrt_rule_grows_lr_with_square_root_of_batch_ratio() -> None:
    """Quadrupling the batch doubles the LR under the square-root rule."""
    assert scaled_lr(0.001, 256, 1024, rule="sqrt") == pytest.approx(0.002)
    assert scaled_lr(0.001, 256, 256, rule="sqrt") == pytest.approx(0.001)


def test_linear_rule_also_scales_down() -> None:
    """Halving the batch halves the LR under the linear rule."""
    assert scaled_lr(1e-3, 64, 32) == pytest.approx(5e-4)


def test_warmup_zero_steps_means_target_immediately_and_caps_at_target() -> None:
    """warmup_steps=0 gives the target at step 0; after warmup the LR stays at the target."""
    assert warmup_lr(0.004, 0, 0) == 0.004
    assert warmup_lr(0.004, 0, 500) == 0.0
    assert warmup_lr(0.004, 500, 500) == pytest.approx(0.004)
    assert warmup_lr(0.004, 9000, 500) == pytest.approx(0.004)


def test_lr_at_step_cosine_goes_from_target_to_min_lr() -> None:
    """Cosine decay: target right after warmup, the mean halfway, min_lr at and after the end."""
    kw = {"target_lr": 1.0, "warmup_steps": 100, "total_steps": 1100, "decay": "cosine",
          "min_lr": 0.1}
    assert lr_at_step(50, **kw) == pytest.approx(0.5)
    assert lr_at_step(100, **kw) == pytest.approx(1.0)
    assert lr_at_step(600, **kw) == pytest.approx(0.55)
    assert lr_at_step(1100, **kw) == pytest.approx(0.1)
    assert lr_at_step(5000, **kw) == pytest.approx(0.1)


def test_lr_at_step_linear_decay_midpoint() -> None:
    """Linear decay with no warmup reaches half the target halfway to total_steps."""
    assert lr_at_step(500, target_lr=0.2, total_steps=1000, decay="linear") == pytest.approx(0.1)


def test_lr_at_step_none_decay_holds_target() -> None:
    """decay='none' keeps the target forever, with or without total_steps."""
    assert lr_at_step(10**6, target_lr=0.3, warmup_steps=10) == 0.3
    assert lr_at_step(10**6, target_lr=0.3, total_steps=5) == 0.3


def test_lr_schedule_accepts_a_count_or_an_iterable() -> None:
    """A count gives steps 0..n-1; an iterable gives exactly those steps."""
    ramp = lr_schedule(5, target_lr=0.004, warmup_steps=4)
    assert ramp == pytest.approx([0.0, 0.001, 0.002, 0.003, 0.004])
    assert lr_schedule([250], target_lr=0.004, warmup_steps=500) == pytest.approx([0.002])
    cosine = lr_schedule(101, target_lr=1.0, total_steps=100, decay="cosine")
    assert all(a >= b for a, b in itertools.pairwise(cosine))
    assert math.isclose(cosine[-1], 0.0, abs_tol=1e-12)


@pytest.mark.parametrize(
    ("call", "names"),
    [
        (lambda: global_batch(0, 8), "per_device_batch (0)"),
        (lambda: global_batch(32, 2.5), "devices (2.5)"),
        (lambda: global_batch(32, True), "devices (True)"),
        (lambda: global_batch(32, 8, -1), "accumulation (-1)"),
        (lambda: scaled_lr(0.001, 256, 1024, rule="cubic"), "rule ('cubic')"),
        (lambda: scaled_lr(-0.1, 256, 1024), "base_lr (-0.1)"),
        (lambda: scaled_lr(0.001, 0, 1024), "base_batch (0)"),
        (lambda: scaled_lr(float("nan"), 256, 1024), "base_lr (nan)"),
        (lambda: warmup_lr(0.004, -1, 500), "step (-1)"),
        (lambda: warmup_lr(0.004, 1, -5), "warmup_steps (-5)"),
        (lambda: lr_at_step(1, target_lr=0.1, decay="cosine"), "total_steps (None)"),
        (lambda: lr_at_step(1, target_lr=0.1, warmup_steps=500, total_steps=100,
                            decay="linear"), "total_steps (100)"),
        (lambda: lr_at_step(1, target_lr=0.1, decay="step"), "decay ('step')"),
        (lambda: lr_at_step(1, target_lr=0.1, min_lr=0.5), "min_lr (0.5)"),
        (lambda: lr_schedule("10", target_lr=0.1), "steps ('10')"),
    ],
)
def test_bad_input_raises_config_error_naming_the_value(call, names: str) -> None:
    """Every bad argument raises ConfigError (a ValueError) whose message names the value."""
    with pytest.raises(ConfigError) as info:
        call()
    assert names in str(info.value)
    assert "e.g." in str(info.value)
    assert isinstance(info.value, ValueError)
