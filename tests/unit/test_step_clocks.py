"""A run's step time by two clocks (issue 39, the step bench): every rank records each
step's wall seconds and the CPU seconds its process spent, and the run's metrics hold the
steady median of each (the first step, warm-up, left out; a step ends with its slowest
rank)."""

from __future__ import annotations

from labkit.config.metrics import RankMetrics


def test_the_run_reports_the_steady_median_of_both_clocks() -> None:
    a = RankMetrics(step_seconds=[9.0, 0.10, 0.30, 0.20], step_cpu_seconds=[5.0, 0.05, 0.07, 0.06])
    b = RankMetrics(step_seconds=[9.0, 0.20, 0.10, 0.20], step_cpu_seconds=[5.0, 0.04, 0.08, 0.09])
    out = RankMetrics.combine([a, b], config=None)
    assert out["step_wall_s"] == 0.20  # per step max: 0.2, 0.3, 0.2 -> median 0.2
    assert out["step_cpu_s"] == 0.08  # per step max: 0.05, 0.08, 0.09 -> median 0.08
    assert "step_seconds" not in out and "step_cpu_seconds" not in out
