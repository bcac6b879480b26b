"""Tensor parallelism on real gloo ranks equals the unsharded model; its bytes match the formula."""

from __future__ import annotations

import pytest

import labkit
from labkit.strategies.tp.cost import tp_bytes_per_layer

pytestmark = [pytest.mark.distributed, pytest.mark.lesson04]

TOL = 1e-5


@pytest.mark.parametrize("world_size", [2, 4])
def test_tp_attention_and_mlp_equal_the_unsharded_model(world_size: int) -> None:
    """Output of step 0, losses and final weights (gathered shards) vs one process, <= 1e-5;
    per-layer all-reduce bytes read from the trace equal 2 x b*s*h*4 forward and backward."""
    r = labkit.run(strategy="tp", world_size=world_size, steps=3, batch_size=4, timeout_s=120,
                   options={"hidden": 128, "heads": 8, "seq": 8, "layers": 2,
                            "dtensor_check": world_size == 2})
    m = r.metrics
    assert m["max_abs_diff_output"] <= TOL, f"rank 0 output differs by {m['max_abs_diff_output']}"
    assert m["max_abs_diff_vs_reference"] <= TOL, (
        f"rank 0 gathered weights differ by {m['max_abs_diff_vs_reference']}")
    assert m["max_abs_diff_loss"] <= TOL
    pred = tp_bytes_per_layer(4, 8, 128, "both")
    for rank, out in enumerate(r.outputs):
        for layer, got in enumerate(out.metrics["comm_bytes_per_layer_measured"]):
            assert got == {"forward": pred["forward"], "backward": pred["backward"]}, (
                f"rank {rank} layer {layer}: traced bytes {got} != predicted {pred}")
        assert out.metrics["comm_bytes_match"], f"rank {rank}: bytes differ between steps"
    assert r.metrics["overlap_fraction"] == pytest.approx(0.0, abs=0.05)
    if world_size == 2:
        dt = m["dtensor"]
        assert dt["max_abs_diff_output"] <= TOL and dt["max_abs_diff_input_grad"] <= TOL
        assert dt["max_abs_diff_fc1_grad"] <= TOL
        assert dt["fc1_local_shape"] == [256, 128]  # 512 columns split over 2 ranks
        assert dt["comm_counts"].get("all_reduce") == 2  # g forward, f backward


def test_tp_mlp_only_sends_one_allreduce_each_way() -> None:
    r = labkit.run(strategy="tp", world_size=2, steps=2, batch_size=2, timeout_s=120,
                   options={"hidden": 64, "heads": 4, "seq": 4, "layers": 1, "block": "mlp"})
    assert r.metrics["max_abs_diff_vs_reference"] <= TOL
    assert r.metrics["comm_bytes_per_layer_measured"] == [{"forward": 2 * 4 * 64 * 4,
                                                           "backward": 2 * 4 * 64 * 4}]
