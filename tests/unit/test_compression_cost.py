"""Predicted bytes of compressed gradient exchanges, from shapes alone."""

from __future__ import annotations

import pytest

from labkit.base.errors import ConfigError
from labkit.config.run import RunConfig
from labkit.strategies.compression.cost import powersgd_values, predicted_payload_bytes

pytestmark = pytest.mark.lesson06


def test_powersgd_sends_p_and_q_for_big_matrices_and_biases_whole() -> None:
    """A 256x32 weight at rank 2: P 256*2 + Q 32*2 values; its bias (256,) goes uncompressed."""
    got = powersgd_values([(256, 32), (256,)], rank=2)
    assert got == {"uncompressed": 256, "p": 512, "q": 64, "total": 832}


def test_powersgd_skips_matrices_that_would_not_shrink_by_the_min_rate() -> None:
    """10x10 at rank 4: (10+10)*4*2 = 160 >= 100 values, so torch sends it whole."""
    assert powersgd_values([(10, 10)], rank=4)["uncompressed"] == 100


def test_fp16_halves_and_topk_grows_with_world_size() -> None:
    shapes = [(1000, 100)]
    none = predicted_payload_bytes("none", shapes, 2)
    half = predicted_payload_bytes("fp16", shapes, 2)
    assert none["payload"] / half["payload"] == 2.0
    assert none["wire"] == pytest.approx(2 * 1 / 2 * 400_000)
    k2 = predicted_payload_bytes("topk", shapes, 2, bucket_numels=[100_000], topk_ratio=0.01)
    k4 = predicted_payload_bytes("topk", shapes, 4, bucket_numels=[100_000], topk_ratio=0.01)
    assert k2["payload"] == 2 * 1000 * 8 and k4["payload"] == 4 * 1000 * 8


def test_options_reject_bad_values_naming_them() -> None:
    with pytest.raises(ConfigError, match=r"method \('zip'\) must be one of none, fp16"):
        RunConfig(strategy="compress", options={"method": "zip"})
    with pytest.raises(ConfigError, match=r"topk_ratio \(0\)"):
        RunConfig(strategy="compress", options={"topk_ratio": 0})
    with pytest.raises(ConfigError, match=r"powersgd_start_step \(1\)"):
        RunConfig(strategy="compress", options={"powersgd_start_step": 1})


def test_randomk_sends_values_only_and_int8_a_quarter_plus_one_scale_per_bucket() -> None:
    """Random-k's positions come from a shared seed (no indices); int8 = numel + 4 B/bucket."""
    shapes, buckets = [[128, 32], [128]], [4096, 128]
    rk = predicted_payload_bytes("randomk", shapes, 4, bucket_numels=buckets, randomk_ratio=0.1)
    assert rk["payload"] == 4 * (409 + 12)
    assert rk["wire"] == pytest.approx(2 * 3 / 4 * rk["payload"])
    q8 = predicted_payload_bytes("int8", shapes, 4, bucket_numels=buckets)
    full = predicted_payload_bytes("none", shapes, 4)
    assert q8["payload"] == (128 * 32 + 128) + 4 * 2
    assert q8["payload"] == pytest.approx(full["payload"] / 4 + 8)
