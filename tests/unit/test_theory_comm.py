"""labkit.theory.comm: ring all-reduce cost, bus bandwidth, alpha-beta fit, speedup laws."""

from __future__ import annotations

import pytest

from labkit.base.errors import ConfigError
from labkit.theory import (
    AlphaBeta,
    algbw,
    amdahl_speedup,
    busbw,
    dp_speedup,
    fit_alpha_beta,
    naive_allreduce_bytes,
    ring_allreduce_bytes,
    ring_allreduce_time,
    scaling_efficiency,
)

pytestmark = pytest.mark.lesson06


@pytest.mark.parametrize(("n", "factor"), [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75)])
def test_ring_allreduce_sends_2_n_minus_1_over_n_times_the_tensor(n: int, factor: float) -> None:
    """Each rank sends 2(n-1)/n x size: reduce-scatter plus all-gather of 1/n chunks."""
    assert ring_allreduce_bytes(100.0, n) == pytest.approx(100.0 * factor)


def test_ring_traffic_per_rank_stays_below_twice_the_tensor() -> None:
    """Seed 003: per-GPU traffic is about twice the gradient, whatever the GPU count."""
    assert ring_allreduce_bytes(1.0, 1024) == pytest.approx(2.0, rel=1e-3)
    assert ring_allreduce_bytes(1.0, 1024) < 2.0


def test_naive_reduce_broadcast_overloads_the_root() -> None:
    """Reduce to rank 0 then broadcast: root sends (n-1) tensors, others one each."""
    naive = naive_allreduce_bytes(100.0, 4)
    assert naive == {"root": 300.0, "non_root": 100.0, "total": 600.0}
    # Same total traffic as the ring, but the ring spreads it evenly over the ranks.
    assert naive["total"] == pytest.approx(4 * ring_allreduce_bytes(100.0, 4))
    assert naive["root"] == pytest.approx(2 * ring_allreduce_bytes(100.0, 4))


def test_naive_all_to_all_sends_every_tensor_to_every_rank() -> None:
    """Each of n ranks sends (n-1) full tensors: n(n-1) tensors in all."""
    naive = naive_allreduce_bytes(100.0, 4, scheme="all_to_all")
    assert naive == {"root": 300.0, "non_root": 300.0, "total": 1200.0}
    assert naive_allreduce_bytes(100.0, 1) == {"root": 0.0, "non_root": 0.0, "total": 0.0}


def test_ring_allreduce_time_alpha_beta() -> None:
    """2(n-1)*alpha + 2(n-1)/n * size / bandwidth."""
    t = ring_allreduce_time(1e8, 4, alpha_s=1e-5, bandwidth_Bps=1e10)
    assert t == pytest.approx(6 * 1e-5 + 1.5e8 / 1e10)
    assert ring_allreduce_time(1e8, 1, 1e-5, 1e10) == 0.0


def test_algbw_and_nccl_tests_bus_bandwidth_factors() -> None:
    """nccl-tests: busbw = algbw x 2(n-1)/n (all-reduce), (n-1)/n (gather/scatter), 1."""
    assert algbw(1e9, 0.1) == pytest.approx(1e10)
    assert busbw(1e10, 8) == pytest.approx(1.75e10)
    assert busbw(1e10, 8, "all_gather") == pytest.approx(0.875e10)
    assert busbw(1e10, 8, "reduce_scatter") == pytest.approx(0.875e10)
    assert busbw(1e10, 8, "broadcast") == pytest.approx(1e10)


def test_busbw_of_a_predicted_ring_all_reduce_recovers_link_bandwidth() -> None:
    """Without latency, the ring's bus bandwidth equals the link bandwidth."""
    size, n, link = 1e9, 8, 25e9
    seconds = ring_allreduce_time(size, n, 0.0, link)
    assert busbw(algbw(size, seconds), n) == pytest.approx(link)


def test_fit_alpha_beta_recovers_the_model_it_was_made_from() -> None:
    """Exact synthetic timings give back alpha, bandwidth and R^2 = 1."""
    truth = AlphaBeta(alpha_s=2e-5, bandwidth_Bps=5e9, world_size=4)
    sizes = [1e4, 1e5, 1e6, 1e7, 1e8]
    fit = fit_alpha_beta(sizes, [truth.predict(s) for s in sizes], world_size=4)
    assert fit.alpha_s == pytest.approx(2e-5)
    assert fit.bandwidth_Bps == pytest.approx(5e9)
    assert fit.world_size == 4
    assert fit.r_squared == pytest.approx(1.0)
    assert fit.predict(3e7) == pytest.approx(truth.predict(3e7))
    assert fit.predict(3e7, world_size=8) == pytest.approx(
        ring_allreduce_time(3e7, 8, 2e-5, 5e9))


def test_fit_alpha_beta_clamps_negative_latency_and_refits_bandwidth() -> None:
    """A line with a negative intercept is forced through the origin instead."""
    sizes = [1e6, 2e6, 3e6]
    times = [0.0009, 0.0021, 0.0030]  # slope ~1.05e-9, intercept < 0
    fit = fit_alpha_beta(sizes, times, world_size=2)
    assert fit.alpha_s == 0.0
    x = sizes  # 2(n-1)/n = 1 for n = 2
    w = [1 / t**2 for t in times]  # relative-error weights
    slope = (sum(wi * a * b for wi, a, b in zip(w, x, times))
             / sum(wi * a * a for wi, a in zip(w, x)))
    assert fit.bandwidth_Bps == pytest.approx(1 / slope)


def test_fit_alpha_beta_is_accurate_in_percent_across_decades() -> None:
    """Sizes from 4 KB to 128 MB with +-8% noise: every size predicted within 20%."""
    import random

    rng = random.Random(0)
    sizes = [4e3 * 4**k for k in range(9)]
    truth = [ring_allreduce_time(s, 2, 50e-6, 2e9) for s in sizes]
    noisy = [t * (1 + rng.uniform(-0.08, 0.08)) for t in truth]
    fit = fit_alpha_beta(sizes, noisy, world_size=2)
    errors = [abs(fit.predict(s) - t) / t for s, t in zip(sizes, truth)]
    assert max(errors) < 0.2, errors


def test_amdahl_speedup() -> None:
    """1 / ((1 - f) + f/n); f = 1 is linear, f = 0 no speedup."""
    assert amdahl_speedup(0.95, 8) == pytest.approx(1 / (0.05 + 0.95 / 8))
    assert amdahl_speedup(1.0, 8) == pytest.approx(8.0)
    assert amdahl_speedup(0.0, 8) == pytest.approx(1.0)


def test_scaling_efficiency_weak_and_strong() -> None:
    """Weak: t1/tn; strong: t1/(n*tn)."""
    assert scaling_efficiency(0.3, 0.4, 8) == pytest.approx(0.75)
    assert scaling_efficiency(8.0, 1.25, 8, weak=False) == pytest.approx(0.8)


def test_why_8_gpus_give_6x() -> None:
    """Seed 003 level II: 0.3 s compute, 0.1 s exposed all-reduce -> 8 x 0.3/0.4 = 6x;
    overlapping all of it gives back the full 8x."""
    assert dp_speedup(0.3, 0.1, 8) == pytest.approx(6.0)
    assert dp_speedup(0.3, 0.1, 8, overlap=1.0) == pytest.approx(8.0)
    assert dp_speedup(0.3, 0.1, 8, overlap=0.5) == pytest.approx(8 * 0.3 / 0.35)
    assert dp_speedup(0.3, 0.1, 1) == 1.0


@pytest.mark.parametrize(
    ("call", "names"),
    [
        (lambda: ring_allreduce_bytes(-1.0, 4), "size_bytes (-1.0)"),
        (lambda: ring_allreduce_bytes(1.0, 0), "world_size (0)"),
        (lambda: naive_allreduce_bytes(1.0, 4, scheme="tree"), "scheme ('tree')"),
        (lambda: ring_allreduce_time(1.0, 4, 1e-6, 0), "bandwidth_Bps (0)"),
        (lambda: ring_allreduce_time(1.0, 4, -1e-6, 1e9), "alpha_s (-1e-06)"),
        (lambda: algbw(1e6, 0.0), "time_s (0.0)"),
        (lambda: busbw(1e9, 4, "gossip"), "collective ('gossip')"),
        (lambda: fit_alpha_beta([1e6], [0.001], 4), "sizes_bytes ([1000000.0])"),
        (lambda: fit_alpha_beta([1e6, 1e6], [0.001, 0.002], 4), "at least 2 distinct"),
        (lambda: fit_alpha_beta([1e6, 2e6], [0.001], 4), "sizes_bytes (2 values)"),
        (lambda: fit_alpha_beta([1e6, 2e6], [0.002, 0.001], 4), "times_s ([0.002, 0.001])"),
        (lambda: fit_alpha_beta([1e6, 2e6], [0.001, 0.002], 1), "world_size (1)"),
        (lambda: amdahl_speedup(1.5, 8), "parallel_fraction (1.5)"),
        (lambda: scaling_efficiency(0.3, 0.0, 8), "step_time_n (0.0)"),
        (lambda: dp_speedup(0.3, 0.1, 8, overlap=2.0), "overlap (2.0)"),
        (lambda: dp_speedup(0.3, -0.1, 8), "comm_s (-0.1)"),
    ],
)
def test_bad_input_raises_config_error_naming_the_value(call, names: str) -> None:
    """Every bad argument raises ConfigError whose message names the value and an example."""
    with pytest.raises(ConfigError) as info:
        call()
    assert names in str(info.value)
    assert "e.g." in str(info.value)
