"""Byte counting for the ZeRO lesson: storages, saved activations, comm per step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from labkit.base.events import Event, Lane, Op
from labkit.strategies.zero import accounting as acc
from labkit.theory import mlp_activation_bytes
from labkit.train.parallel.zero_units import Meter

pytestmark = pytest.mark.lesson05


def test_views_are_counted_once_in_the_first_term_that_holds_them() -> None:
    """A fp32 optimizer updating a view of the parameters adds no bytes of its own."""
    full = torch.zeros(100)
    grad = torch.zeros(100)
    m = torch.zeros(50)
    kept = {"params": [full, full[:10]], "grads": [grad], "optimizer": [full[50:], m]}
    assert acc.storage_bytes(kept) == {"params": 400, "grads": 400, "optimizer": 200}


def test_saved_activations_of_an_mlp_match_the_formula() -> None:
    """Linear saves its input, ReLU its output (the same storage as the next input)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 48), nn.ReLU(),
                        nn.Linear(48, 10))
    x = torch.randn(16, 32)
    with acc.SavedActivations(net.parameters()) as saved:
        net(x).sum()
    assert saved.bytes == mlp_activation_bytes(16, [32, 64, 48, 10], 4, final_relu=False)


def test_a_whole_step_of_an_mlp_classifier_matches_the_step_formula() -> None:
    """The layers' saves and cross-entropy's (fp32 log-probabilities, int64 targets, one fp32
    scalar), in fp32; labkit's own bf16 and checkpointed ZeRO runs, whose 16-bit weights and
    checkpointed input a plain torch model does not reproduce, are checked to the byte in
    tests/distributed/test_zero.py and lesson 05's claims."""
    from labkit.theory import cross_entropy_saved_bytes, mlp_step_activation_bytes

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 48), nn.ReLU(),
                        nn.Linear(48, 10))
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    with acc.SavedActivations(net.parameters()) as saved:
        nn.functional.cross_entropy(net(x), y)
    assert saved.bytes == mlp_step_activation_bytes(16, [32, 64, 48, 10], 4, final_relu=False)
    assert cross_entropy_saved_bytes(16, 10) == 16 * 10 * 4 + 16 * 8 + 4
    assert mlp_step_activation_bytes(16, [32, 64, 48, 10], 2, checkpointing=True,
                                     final_relu=False) \
        == mlp_activation_bytes(16, [32, 64, 48, 10], 2, checkpointing=True, final_relu=False) \
        + 16 * 32 * 2 + cross_entropy_saved_bytes(16, 10)  # the input's other 2 bytes


def test_comm_per_step_skips_the_first_step_and_applies_ring_factors() -> None:
    def ev(op: Op, step: int, nbytes: int) -> Event:
        return Event(rank=0, lane=Lane.COMM, op=op, start_ns=0, dur_ns=1, step=step,
                     bytes=nbytes)
    events = [ev(Op.ALL_REDUCE, 0, 999), ev(Op.REDUCE_SCATTER, 1, 400), ev(Op.ALL_GATHER, 1, 400),
              ev(Op.REDUCE_SCATTER, 2, 400), ev(Op.ALL_GATHER, 2, 400),
              Event(rank=0, lane=Lane.COMM, op=Op.ALL_GATHER, start_ns=0, dur_ns=1, bytes=7)]
    out = acc.comm_per_step(events, 4)
    assert out == {"payload": 800.0, "wire": pytest.approx(2 * 0.75 * 400)}


def test_meter_keeps_the_peak_of_live_transients() -> None:
    meter = Meter()
    a, b = torch.zeros(10), torch.zeros(5)
    meter.alloc(a)
    meter.alloc(b)
    meter.free(a)
    meter.alloc(a)
    meter.free(a, b)
    assert (meter.live, meter.peak) == (0, 60)


def test_predicted_uses_mixed_constants_for_bf16() -> None:
    """bf16 runs are compared with K = 12 (2 B weights, 2 B grads, 12 B Adam + master)."""
    p = acc.predicted(1000, 2, 1, "bf16", "adam")
    assert p["theory_precision"] == "mixed"
    assert p["bytes"] == {"params": 2000, "grads": 2000, "optimizer": 6000}
    assert p["comm_wire"] == pytest.approx(p["ddp_comm_wire"])
    assert acc.predicted(1000, 2, 3, "fp32", "adam")["comm_wire"] == pytest.approx(
        1.5 * p["ddp_comm_wire"] * 2)


def test_checkpoint_segments_keep_only_segment_inputs() -> None:
    """Per-block checkpointing of an MLP saves nothing (ReLU output = next input); segments
    of 2 blocks keep every other block input. widths 32 -> 64 x 4 -> 10, last Linear plain."""
    widths = [32, 64, 64, 64, 64, 10]
    plain = mlp_activation_bytes(8, widths, 4, final_relu=False)
    per_block = mlp_activation_bytes(8, widths, 4, checkpointing=True, final_relu=False)
    pairs = mlp_activation_bytes(8, widths, 4, checkpointing=True, final_relu=False, segment=2)
    assert plain == per_block == 8 * (32 + 64 * 4) * 4
    assert pairs == 8 * (32 + 64 + 64) * 4
