"""labkit.theory.checkpointing: Young's (1974) and Daly's (2006) checkpoint intervals, Daly's
expected wall time, and the steps a crash makes a run compute twice."""

from __future__ import annotations

import math

import pytest

from labkit.base.errors import ConfigError
from labkit.theory import (
    daly_interval,
    expected_wall_time,
    steps_redone,
    waste_fraction,
    young_interval,
    young_waste_fraction,
)

pytestmark = pytest.mark.lesson07


def test_young_worked_number_five_minute_saves_daily_failures() -> None:
    """Young 1974, tau = sqrt(2 delta M): 5-minute saves, a failure a day -> 120 minutes."""
    assert young_interval(5 * 60, 24 * 3600) == pytest.approx(120 * 60)


def test_daly_higher_order_estimate_worked_number() -> None:
    """Daly 2006: sqrt(2dM)(1 + sqrt(d/2M)/3 + (d/2M)/9) - d; for d = 5, M = 1440 minutes,
    x = 5/2880: 120 (1 + 0.0138889 + 0.0001929) - 5 = 116.69 minutes."""
    x = 5 / 2880
    by_hand = 120 * (1 + math.sqrt(x) / 3 + x / 9) - 5
    assert by_hand == pytest.approx(116.69, abs=0.01)
    assert daly_interval(5 * 60, 24 * 3600) == pytest.approx(by_hand * 60)


def test_daly_estimate_is_the_mtbf_when_a_save_costs_two_mtbfs_or_more() -> None:
    """Daly 2006: for delta >= 2M the optimum is M itself."""
    assert daly_interval(200.0, 100.0) == 100.0
    assert daly_interval(300.0, 100.0) == 100.0


def _argmin_wall_time(delta: float, mtbf: float, restart: float = 0.0) -> float:
    """The interval minimizing Daly's T_w, by golden-section search over log tau."""
    lo, hi = math.log(delta * 1e-3), math.log(mtbf * 10)
    f = lambda u: expected_wall_time(math.exp(u), delta, mtbf, 1.0, restart)
    for _ in range(200):  # golden-section search: T_w is unimodal in tau
        a, b = lo + (hi - lo) * 0.382, lo + (hi - lo) * 0.618
        lo, hi = (lo, b) if f(a) < f(b) else (a, hi)
    return math.exp((lo + hi) / 2)


@pytest.mark.parametrize("delta, mtbf", [(300.0, 86400.0), (60.0, 3 * 3600.0), (0.05, 30.0)])
def test_daly_estimate_sits_at_the_minimum_of_his_wall_time_model(delta: float, mtbf: float) -> None:
    """Daly's estimate is the optimum of his own T_w(tau) to within 1% for delta << M, and
    closer to it than Young's first-order interval."""
    best = _argmin_wall_time(delta, mtbf)
    assert daly_interval(delta, mtbf) == pytest.approx(best, rel=0.01)
    assert abs(daly_interval(delta, mtbf) - best) < abs(young_interval(delta, mtbf) - best)


def test_restart_time_scales_the_wall_time_but_not_the_best_interval() -> None:
    """Daly's T_w carries exp(R/M) as a factor: the restart lengthens the job, not the optimum."""
    a = expected_wall_time(3600.0, 300.0, 86400.0, 1e6)
    b = expected_wall_time(3600.0, 300.0, 86400.0, 1e6, restart_s=600.0)
    assert b / a == pytest.approx(math.exp(600 / 86400))
    assert _argmin_wall_time(300.0, 86400.0, 600.0) == pytest.approx(
        _argmin_wall_time(300.0, 86400.0), rel=1e-4)


def test_wall_time_tends_to_useful_work_plus_saves_when_failures_are_rare() -> None:
    """With M -> infinity, T_w -> T_s (tau + delta) / tau: only the saves cost time."""
    assert expected_wall_time(100.0, 10.0, 1e12, 1000.0) == pytest.approx(1100.0, rel=1e-6)
    assert waste_fraction(100.0, 10.0, 1e12) == pytest.approx(0.1, rel=1e-5)


def test_young_first_order_waste_is_smallest_at_youngs_interval() -> None:
    """delta/tau + tau/(2M) is minimal at sqrt(2 delta M), where it equals sqrt(2 delta / M)."""
    d, m = 30.0, 7200.0
    tau = young_interval(d, m)
    best = young_waste_fraction(tau, d, m)
    assert best == pytest.approx(math.sqrt(2 * d / m))
    assert young_waste_fraction(tau / 2, d, m) > best < young_waste_fraction(tau * 2, d, m)
    assert waste_fraction(tau, d, m) == pytest.approx(best, rel=0.1)  # first order: d << M


@pytest.mark.parametrize("fault, every, redone", [(9, 4, 1), (8, 4, 0), (11, 4, 3), (3, 4, 3),
                                                  (5, 2, 1), (0, 4, 0)])
def test_steps_redone_since_the_last_committed_checkpoint(fault: int, every: int, redone: int) -> None:
    """step_N holds N completed steps: a crash as step s begins resumes at the last multiple
    of the interval, so s mod every steps run twice (lesson 07: killed at 9, saved every 4)."""
    assert steps_redone(fault, every) == redone


def test_bad_inputs_name_the_value_and_an_example() -> None:
    with pytest.raises(ConfigError, match=r"delta_s \(-1\).*e\.g\."):
        young_interval(-1, 100)
    with pytest.raises(ConfigError, match=r"every \(0\)"):
        steps_redone(9, 0)
    with pytest.raises(ConfigError, match=r"mtbf_s \(0\)"):
        daly_interval(1.0, 0)
