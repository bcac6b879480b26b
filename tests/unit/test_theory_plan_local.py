""""This machine" as the planner's cluster: the matmul rate of a step's shapes, the measured
wire used as measured, bad input named before anything runs."""

from __future__ import annotations

import pytest

from labkit.base.errors import ConfigError
from labkit.theory.plan import predict
from labkit.theory.plan_local import gemm_rate, measured_cluster
from labkit.theory.plan_models import MODELS, Training
from labkit.theory.plan_terms import LINK_EFFICIENCY, Layout, allreduce_time

pytestmark = pytest.mark.lesson13


def test_gemm_rate_is_the_flop_weighted_harmonic_mean() -> None:
    """Two shapes of equal FLOPs at 1 and 3 GFLOP/s take 1 + 1/3 time units: 1.5 GFLOP/s."""
    rates = {"10x10x10": 1e9, "20x5x10": 3e9}
    assert gemm_rate(rates, [(10, 10, 10), (20, 5, 10)]) == pytest.approx(1.5e9)


def test_gemm_rate_names_the_shapes_calibrate_lacks() -> None:
    with pytest.raises(ConfigError, match=r"\(7, 7, 7\).*labkit calibrate"):
        gemm_rate({"10x10x10": 1e9}, [(10, 10, 10), (7, 7, 7)])


def test_the_measured_wire_is_used_as_measured() -> None:
    """The planner discounts datasheet bandwidth by LINK_EFFICIENCY; a fitted wire is already
    what a collective reaches, so its all-reduce time is the ring formula on the fit."""
    net = measured_cluster(rate_flops_per_s=1e9, alpha_s=50e-6, bandwidth_Bps=2e9, ranks=4,
                           memory_bytes=16e9)
    t, inter = allreduce_time(1e6, 4, 1, net)
    assert t == pytest.approx(2 * 3 * 50e-6 + 2 * 3 / 4 * 1e6 / 2e9) and inter == 0.0
    assert net.intra.bandwidth_Bps * LINK_EFFICIENCY == pytest.approx(2e9)
    assert net.gpu.memory_bytes == pytest.approx(4e9) and net.per_node == net.gpus == 4


def test_compute_of_one_rank_follows_the_rate_it_is_given() -> None:
    """Halving the rate doubles the compute term, and nothing else of a DP-free step."""
    model, training = MODELS["lab-gpt"], Training(global_batch_tokens=8 * 64,
                                                   precision="fp32", optimizer="momentum")
    lay = Layout(1, 1, 2, 4, 2)
    terms = []
    for rate in (2e9, 1e9):
        net = measured_cluster(rate_flops_per_s=rate, alpha_s=0.0, bandwidth_Bps=1e12, ranks=2,
                               memory_bytes=8e9)
        terms.append({t.name: t.value for t in predict(model, net, training, lay).time})
    assert terms[1]["compute"] == pytest.approx(2 * terms[0]["compute"])
    assert terms[1]["bubble"] == pytest.approx(2 * terms[0]["bubble"])


@pytest.mark.parametrize("field, value", [("rate_flops_per_s", 0.0), ("bandwidth_Bps", -1.0),
                                          ("memory_bytes", 0.0), ("alpha_s", -1e-6)])
def test_bad_measurements_are_named(field: str, value: float) -> None:
    kwargs = {"rate_flops_per_s": 1e9, "alpha_s": 1e-5, "bandwidth_Bps": 1e9, "ranks": 2,
              "memory_bytes": 8e9, field: value}
    with pytest.raises(ConfigError, match=field):
        measured_cluster(**kwargs)
