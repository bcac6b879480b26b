"""Every ps1 answer key comes from labkit.theory and reproduces the seeds' worked examples."""

from __future__ import annotations

import math

import pytest

from labkit.grading import numeric

pytestmark = pytest.mark.lesson08


def test_seed_000_exercise_1_numbers() -> None:
    """Seed 000: 'Global batch: 1024; Target LR: 0.004; LR at step 250: 0.002'."""
    assert numeric.key_global_batch(8, 32, 4) == 1024
    assert math.isclose(numeric.key_target_lr(0.001, 256, 8, 32, 4), 0.004)
    assert math.isclose(numeric.key_warmup_lr(0.004, 250, 500), 0.002)


def test_seed_003_level_two_numbers() -> None:
    """Seed 003 Level II: 8 GPUs at local batch 64, LR 1e-3 -> batch 512, LR 8e-3."""
    assert numeric.key_global_batch(8, 64, 1) == 512
    assert math.isclose(numeric.key_target_lr(1e-3, 64, 8, 64, 1), 8e-3)


def test_seed_000_memory_for_3b_adam_on_4_gpus() -> None:
    """3B params, mixed Adam: 48 GB/GPU plain DP (won't fit 24 GB), 16.5 ZeRO-2, 12 ZeRO-3."""
    assert math.isclose(numeric.key_adam_gb_per_gpu(3e9, 4, 0), 48.0)
    assert math.isclose(numeric.key_adam_gb_per_gpu(3e9, 4, 2), 16.5)
    assert math.isclose(numeric.key_adam_gb_per_gpu(3e9, 4, 3), 12.0)


def test_zero_paper_numbers() -> None:
    """ZeRO paper: 7.5B params on 64 GPUs: 120, 31.4, 16.6, 1.9 GB."""
    got = [numeric.key_adam_gb_per_gpu(7.5e9, 64, s) for s in range(4)]
    for g, want in zip(got, (120.0, 31.4, 16.6, 1.9)):
        assert math.isclose(g, want, rel_tol=0.02)  # paper rounds to 0.1 GB


def test_bubble_and_ring_keys() -> None:
    assert math.isclose(numeric.key_bubble_share(4, 8), 3 / 11)
    assert math.isclose(numeric.key_ring_bytes(4e9, 8), 7e9)
    assert math.isclose(numeric.key_ring_time(4e9, 8, 5e-6, 25e9), 14 * 5e-6 + 7e9 / 25e9)


@pytest.mark.parametrize("name", sorted(numeric.KEYS))
def test_correct_formula_passes_visible_and_hidden(name: str) -> None:
    key = numeric.KEYS[name]
    assert numeric.check(name, key).passed
    assert numeric.check(name, key, hidden=True, seed=3).passed


def test_hidden_variants_are_seeded_and_differ_by_seed() -> None:
    a = list(numeric._variants("bubble_share", 1, 5))
    assert a == list(numeric._variants("bubble_share", 1, 5))
    assert a != list(numeric._variants("bubble_share", 2, 5))
