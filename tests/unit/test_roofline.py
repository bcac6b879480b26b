"""The data-parallel roofline, checked against the outside definitions it is built from:
6 FLOPs per weight and token for training (Kaplan et al. 2020, "Scaling Laws for Neural
Language Models", section 2.1: C ~ 6N per token), the ring all-reduce's 2(n-1)/n x S bytes
per rank (nccl-tests doc/PERFORMANCE.md), and the datasheets' numbers (A100 SXM: 312 TFLOP/s
dense bf16, NVLink 3 600 GB/s bidirectional; H100 SXM: 989 TFLOP/s, NVLink 4 900 GB/s)."""

from __future__ import annotations

import math

import pytest

from labkit.base.errors import ConfigError
from labkit.theory import (
    ACCELERATORS,
    dp_allreduce_time,
    dp_compute_time,
    dp_crossover_batch,
    dp_roofline,
    node_crossover,
    ring_allreduce_bytes,
    training_flops,
)


def test_compute_is_kaplans_6n_per_token() -> None:
    """GPT-3 175B (Brown et al. 2020, table D.1: 3.14e23 FLOPs for 300B tokens): 6 x 175e9 x
    300e9 = 3.15e23 FLOPs, i.e. that many seconds at 1 FLOP/s."""
    assert dp_compute_time(175e9, 300e9, 1.0) == pytest.approx(3.15e23)
    assert dp_compute_time(175e9, 300e9, 1.0) == pytest.approx(3.14e23, rel=0.01)
    assert dp_compute_time(1e6, 32, 1e9) == training_flops(1_000_000, 32) / 1e9


def test_allreduce_is_the_rings_bytes_over_the_bandwidth() -> None:
    """1.3e9 bf16 gradients (2.6 GB) on 8 GPUs at 300 GB/s each way: 7/4 x 2.6e9 / 300e9 =
    15.2 ms; the same as ring_allreduce_bytes / bandwidth; nothing on one device."""
    t = dp_allreduce_time(1.3e9, 8, 300e9)
    assert t == pytest.approx(1.75 * 2.6e9 / 300e9) == pytest.approx(0.015167, rel=1e-3)
    assert t == pytest.approx(ring_allreduce_bytes(2.6e9, 8) / 300e9)
    assert dp_allreduce_time(1.3e9, 1, 300e9) == 0.0


def test_crossover_on_8_gpu_nodes_from_the_datasheets() -> None:
    """A100: 1.75 x 2 x 312e12 / (6 x 300e9) = 606.7 tokens per GPU; H100 SXM:
    1.75 x 2 x 989e12 / (6 x 450e9) = 1282.0; per-direction NVLink is half the datasheet's
    bidirectional 600 / 900 GB/s."""
    assert ACCELERATORS["A100"].bandwidth_Bps == 600e9 / 2
    assert ACCELERATORS["H100"].bandwidth_Bps == 900e9 / 2
    assert node_crossover("A100") == pytest.approx(606.67, abs=0.01)
    assert node_crossover("H100") == pytest.approx(1282.04, abs=0.01)
    assert node_crossover("A100", bytes_per_param=4) == pytest.approx(2 * 606.67, abs=0.02)


@pytest.mark.parametrize("params", [1e6, 1.3e9, 70e9])
def test_at_the_crossover_compute_equals_the_allreduce_whatever_the_model(params: float) -> None:
    b = dp_crossover_batch(8, 312e12, 300e9)
    assert dp_compute_time(params, b, 312e12) == pytest.approx(dp_allreduce_time(params, 8, 300e9))


def test_the_roofline_rows_switch_bound_at_the_crossover() -> None:
    """A 1.3B model on 8 A100s: 256 tokens per GPU is communication-bound, 1024 compute-bound."""
    rows = dp_roofline(1.3e9, "A100", [256, 1024])
    assert [r["bound"] for r in rows] == ["communication", "compute"]
    assert rows[0]["allreduce_s"] == rows[1]["allreduce_s"]
    assert math.isclose(float(rows[1]["compute_s"]), 6 * 1.3e9 * 1024 / 312e12)


def test_bad_inputs_name_the_value() -> None:
    with pytest.raises(ConfigError, match="gpu"):
        node_crossover("V100")
    with pytest.raises(ConfigError, match="world_size"):
        dp_crossover_batch(0, 1e12, 1e9)
    with pytest.raises(ConfigError, match="batches"):
        dp_roofline(1e9, "A100", [])
    assert dp_crossover_batch(1, 312e12, 300e9) == 0.0
