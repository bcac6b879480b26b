"""The seeds' own numbers, the offload terms, and the other calculators issue 18 added.

Seed 003's "7B needs about 126 GB" (18 B/param), seed 001's ZeRO "8x / 16x" (really 3.82x
and 7.21x at N_d = 64), GPT-3's 700 / 350 GB, the DeepSpeed ZeRO-3 config mapped onto
labkit, the two-level all-reduce and LARS's layer learning rate.
"""

from __future__ import annotations

import pytest

from labkit import theory
from labkit.base.errors import ConfigError

pytestmark = pytest.mark.lesson05
SEED_001_CONFIG = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                         "offload_param": {"device": "cpu"}},
                   "bf16": {"enabled": True}, "train_batch_size": 256,
                   "gradient_accumulation_steps": 4}


def test_seed_003_126_gb_is_18_bytes_per_param_and_the_rule_is_16() -> None:
    assert 7e9 * theory.bytes_per_param(fp32_grads=True)["total"] / 1e9 == 126
    assert 7e9 * theory.bytes_per_param()["total"] / 1e9 == 112
    with pytest.raises(ConfigError, match="fp32_grads=True only applies"):
        theory.bytes_per_param("fp32", fp32_grads=True)


def test_seed_001_zero_reductions_are_half_what_it_says() -> None:
    full = theory.zero_memory(7.5e9, 64, 0)["total"]
    got = [full / theory.zero_memory(7.5e9, 64, s)["total"] for s in (1, 2)]
    assert got == pytest.approx([3.82, 7.21], abs=0.005)
    assert 175e9 * theory.bytes_per_param("fp32")["params"] / 1e9 == 700
    assert 175e9 * theory.bytes_per_param()["params"] / 1e9 == 350


def test_offload_moves_the_optimizer_to_the_host_and_costs_pcie_traffic() -> None:
    plain = theory.zero_memory(7e9, 8, 3)
    off = theory.zero_memory(7e9, 8, 3, offload_optimizer=True)
    assert off["optimizer"] == 0 and off["cpu"] == plain["optimizer"]
    assert off["total"] == pytest.approx(plain["total"] - plain["optimizer"])
    both = theory.zero_memory(7e9, 8, 3, offload_optimizer=True, offload_params=True)
    assert both["total"] == plain["grads"]
    assert theory.zero_offload_traffic(7e9, 8) == 2 * 2 * 7e9 / 8
    with pytest.raises(ConfigError, match="offload_params needs stage 3"):
        theory.zero_memory(7e9, 8, 2, offload_params=True)


def test_deepspeed_zero3_config_maps_field_by_field() -> None:
    rows = {r.field: r for r in theory.deepspeed_plan(SEED_001_CONFIG, params=7.5e9, gpus=8)}
    assert rows["zero_optimization.stage"].value == 3
    assert "labkit run zero --stage 3" in rows["zero_optimization.stage"].labkit
    assert "11.2 GB per GPU of optimizer state" in rows["zero_optimization.offload_optimizer"].prediction
    assert "--batch-size 8 --accumulation 4 --world-size 8" in \
        rows["train_batch_size / gradient_accumulation_steps"].labkit
    assert rows["total on the GPU"].value == "1.88 GB"  # only the gradient shard stays
    with pytest.raises(ConfigError, match="train_batch_size \\(250\\) must be a multiple"):
        theory.deepspeed_plan({**SEED_001_CONFIG, "train_batch_size": 250}, params=1e9, gpus=8)


def test_hierarchical_all_reduce_sends_one_gth_across_nodes() -> None:
    got = theory.hierarchical_allreduce_bytes(4e9, 8, 4)
    assert got["inter"] == pytest.approx(theory.ring_allreduce_bytes(4e9 / 8, 4))
    assert got["intra"] == pytest.approx(2 * 7 / 8 * 4e9)
    assert got["flat_ring"] == pytest.approx(theory.ring_allreduce_bytes(4e9, 32))


def test_lars_local_lr_is_the_trust_ratio_times_lr() -> None:
    assert theory.lars_local_lr(2.0, 3.0, 0.5, eta=0.01) == pytest.approx(2.0 * 0.01 * 3 / 0.5)
    assert theory.lars_local_lr(1.0, 3.0, 0.5, weight_decay=0.5) == pytest.approx(
        0.001 * 3 / (0.5 + 1.5))
    with pytest.raises(ConfigError, match="undefined"):
        theory.lars_local_lr(1.0, 0.0, 0.0)
