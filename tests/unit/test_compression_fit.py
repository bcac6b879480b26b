"""Fitting "this machine" on some sizes and validating on the held-out ones (no processes)."""

from __future__ import annotations

import pytest

from labkit.lessons.compression import fit_and_validate
from labkit.theory.comm import ring_allreduce_time
from labkit.theory.interconnect import predict_step_time, this_machine

pytestmark = pytest.mark.lesson06


def test_exact_alpha_beta_data_is_recovered_and_held_out_error_is_zero() -> None:
    sizes = [1e6 * 2 ** k for k in range(6)]
    times = [ring_allreduce_time(s, 2, 50e-6, 1.5e9) for s in sizes]
    report = fit_and_validate(sizes, times, 2)
    assert report["fit"].alpha_s == pytest.approx(50e-6, rel=1e-6)
    assert report["fit"].bandwidth_Bps == pytest.approx(1.5e9, rel=1e-6)
    assert [r["used_for_fit"] for r in report["rows"]] == [True, False] * 3
    assert report["max_holdout_error"] < 1e-9


def test_noisy_held_out_point_shows_up_as_its_relative_error() -> None:
    sizes = [1e6, 2e6, 4e6]
    times = [ring_allreduce_time(s, 2, 0.0, 1e9) for s in sizes]
    times[1] *= 1.3
    report = fit_and_validate(sizes, times, 2)
    assert report["max_holdout_error"] == pytest.approx(1 - 1 / 1.3, rel=1e-6)


def test_fitted_preset_feeds_the_step_time_model() -> None:
    sizes = [1e6, 4e6, 16e6]
    fit = fit_and_validate(sizes, [ring_allreduce_time(s, 2, 1e-5, 2e9) for s in sizes], 2)["fit"]
    link = this_machine(fit)
    pred = predict_step_time("dp", params=1e6, compute_s=0.1, world_size=2, link=link,
                             bytes_per_value=4)
    assert pred.comm_s == pytest.approx(ring_allreduce_time(4e6, 2, 1e-5, 2e9), rel=1e-6)
