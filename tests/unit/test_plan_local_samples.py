"""``labkit.lessons.plan_local.fitted_samples``: an engine whose one-rank samples leave no
FLOP-proportional part to fit (a noisy moment; seen once on a quiet machine) is measured
again, and says why; after ``ENGINE_TRIES`` the fit's own error stands."""

from __future__ import annotations

from typing import Any

import pytest

from labkit.base.errors import ConfigError
from labkit.lessons import plan_local
from labkit.theory.plan_lab import LAB_GPT
from labkit.theory.plan_local import CostSample, step_flops


def _samples(good: bool) -> list[CostSample]:
    """The engine's sizes; a good set grows with the FLOPs, a bad one is flat (no rate)."""
    return [CostSample(layers=L, batch=b, strategy="ddp", microbatches=1,
                       seconds=(1e-3 + step_flops(LAB_GPT, L, b) / 5e10) if good else 0.01)
            for L, b in plan_local.SIZES]


def _measure(monkeypatch: pytest.MonkeyPatch, goods: list[bool]) -> list[Any]:
    calls: list[Any] = []

    def engine_samples(strategy: str, steps: int, rounds: int) -> list[CostSample]:
        calls.append(strategy)
        return _samples(goods[len(calls) - 1])

    monkeypatch.setattr(plan_local, "engine_samples", engine_samples)
    return calls


def test_a_fit_that_noise_ruined_is_measured_again(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _measure(monkeypatch, [False, True])
    said: list[str] = []
    got = plan_local.fitted_samples("ddp", note=said.append)
    assert got == _samples(True) and calls == ["ddp", "ddp"]
    assert len(said) == 1 and "no FLOP-proportional part" in said[0] and "again" in said[0]


def test_the_last_tries_error_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _measure(monkeypatch, [False] * plan_local.ENGINE_TRIES)
    with pytest.raises(ConfigError, match="no FLOP-proportional part"):
        plan_local.fitted_samples("ddp")
    assert len(calls) == plan_local.ENGINE_TRIES


def test_a_good_first_measurement_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _measure(monkeypatch, [True])
    assert plan_local.fitted_samples("ddp") == _samples(True) and calls == ["ddp"]
