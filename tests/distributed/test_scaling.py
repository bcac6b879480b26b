"""The scaling strategy on real gloo ranks: accumulation equivalence and the LR experiment."""

from __future__ import annotations

import math

import pytest

from labkit.lessons.scaling import (
    accumulation_check,
    lr_experiment,
    optimizer_comparison,
)

pytestmark = [pytest.mark.distributed, pytest.mark.lesson02]


def test_accumulation_equals_the_big_batch() -> None:
    """2 ranks x 16 samples x 4 micro-batches == one process on 128 samples (<= 1e-6)."""
    res = accumulation_check(world_size=2, per_rank_batch=16, accumulation=4, steps=5)
    assert res["global_batch"] == 128
    assert res["max_abs_diff"] <= 1e-6, (
        f"rank 0 weights differ from the single-process big batch by {res['max_abs_diff']:.3g}")


def test_lr_experiment_ordering() -> None:
    """Same samples: linear scaling (+warmup) reaches the 1-rank loss, unscaled lags,
    the too-large LR diverges and clipping keeps it finite."""
    exp = lr_experiment(world_size=4, per_rank_batch=16, base_lr=0.2, samples=2560)
    final = {name: run.final_loss() for name, run in exp.runs.items()}
    one = final["1 rank"]
    unscaled = final["4 ranks, LR unscaled"]
    assert unscaled > one + 0.5, final
    for name in ("4 ranks, linear scaling", "4 ranks, linear + warmup"):
        assert final[name] < one + 0.2, (name, final)
        assert final[name] < unscaled - 0.5, (name, final)
    assert exp.runs["4 ranks, LR x16 too large"].diverged, final
    clipped = exp.runs["4 ranks, LR x16 + clipping"]
    assert not clipped.diverged and all(math.isfinite(v) for v in clipped.losses), final
    scaled = exp.runs["4 ranks, linear + warmup"]
    assert scaled.lrs[:4] == pytest.approx([0.0, 0.8 / 3, 1.6 / 3, 0.8]), scaled.lrs[:4]


def test_lars_and_lamb_train_at_a_large_batch() -> None:
    exp = optimizer_comparison(world_size=2, per_rank_batch=128, steps=12)
    for name, run in exp.runs.items():
        assert not run.diverged, (name, run.losses)
        assert run.final_loss() < run.losses[0] - 0.1, (name, run.losses)
