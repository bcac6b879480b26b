"""Compressed DDP comm hooks on real gloo ranks: traced bytes equal the shape-based prediction."""

from __future__ import annotations

import math

import pytest

import labkit
from labkit.config.run import ModelConfig

pytestmark = [pytest.mark.distributed, pytest.mark.lesson06]

MODEL = ModelConfig(in_dim=32, width=128, depth=2, out_dim=10)
STEPS = 4


def _run(method: str, **kw: object) -> labkit.RunResult:
    return labkit.run(strategy="compress", world_size=2, steps=STEPS, model=MODEL,
                      timeout_s=120, options={"method": method, **kw.pop("options", {})}, **kw)


@pytest.fixture(scope="module")
def plain() -> labkit.RunResult:
    return _run("none", check_reference=True)


def test_uncompressed_hook_equals_single_process_reference(plain: labkit.RunResult) -> None:
    assert plain.metrics["max_abs_diff_vs_reference"] <= 1e-5
    assert plain.metrics["compression_ratio"] == pytest.approx(1.0)


def test_fp16_sends_exactly_half_the_bytes(plain: labkit.RunResult) -> None:
    r = _run("fp16")
    for rank, out in enumerate(r.outputs):
        wire = out.metrics["wire_bytes_per_step"]
        assert wire == [w / 2 for w in plain.outputs[rank].metrics["wire_bytes_per_step"]], rank
    assert r.metrics["compression_ratio"] == 2.0
    assert all(abs(a - b) < 1e-2 for a, b in zip(r.losses, plain.losses))


@pytest.mark.parametrize("method", ["powersgd", "topk", "randomk", "int8"])
def test_traced_bytes_equal_prediction_from_shapes(method: str, plain: labkit.RunResult) -> None:
    """PowerSGD, top-k, random-k (values only, shared positions) and int8 (a quarter of
    fp32 plus one 4-byte scale per bucket): traced bytes = the prediction from shapes."""
    r = _run(method, options={"rank": 2, "topk_ratio": 0.05, "randomk_ratio": 0.05})
    for rank, out in enumerate(r.outputs):
        m = out.metrics
        assert m["payload_bytes_per_step"][-1] == m["predicted_payload_bytes"], (
            f"rank {rank} {method}: traced {m['payload_bytes_per_step']} vs predicted "
            f"{m['predicted_payload_bytes']}")
    if method == "powersgd":  # warm-up steps all-reduce the full gradient
        assert r.metrics["payload_bytes_per_step"][0] == plain.metrics["payload_bytes_per_step"][0]
    assert r.metrics["compression_ratio"] > (3.9 if method == "int8" else 5)
    assert all(math.isfinite(v) for v in r.losses)
    assert abs(r.losses[-1] - plain.losses[-1]) < 0.1  # same task, close loss after 4 steps
