"""labkit.theory.interconnect: link presets and per-strategy step-time predictions."""

from __future__ import annotations

import pytest

from labkit.base.errors import ConfigError
from labkit.theory import (
    INTERCONNECTS,
    AlphaBeta,
    get_link,
    predict_step_time,
    ring_allreduce_time,
    this_machine,
)

pytestmark = pytest.mark.lesson06
NVLINK, IB = INTERCONNECTS["nvlink4"], INTERCONNECTS["infiniband_hdr"]


def test_presets_use_the_datasheet_numbers() -> None:
    """Per direction: PCIe 4.0 / 5.0 x16 = 16 / 32 GT/s x 16 lanes x 128/130 / 8 bits (PCI-SIG);
    NVLink 3 600 GB/s and NVLink 4 900 GB/s both ways (A100 / H100 datasheets, seeds 003 / 001);
    InfiniBand HDR 200 Gb/s and NDR 400 Gb/s per port; Ethernet 100 and 10 Gb/s."""
    pcie = lambda gt: gt * 1e9 * 16 * 128 / 130 / 8
    expected = {"pcie4": pcie(16), "pcie5": pcie(32), "nvlink3": 600e9 / 2, "nvlink4": 900e9 / 2,
                "nvswitch": 900e9 / 2, "infiniband_hdr": 200e9 / 8, "infiniband_ndr": 400e9 / 8,
                "ethernet_100g": 100e9 / 8, "ethernet_10g": 10e9 / 8}
    for name, bandwidth in expected.items():
        assert INTERCONNECTS[name].bandwidth_Bps == pytest.approx(bandwidth, rel=2e-3), name
        assert INTERCONNECTS[name].alpha_s > 0
    assert "31.5 GB/s" in INTERCONNECTS["pcie4"].note
    assert "900 GB/s" in NVLINK.note
    assert {link.scope for link in INTERCONNECTS.values()} == {"intra-node", "inter-node"}
    assert NVLINK.scope == "intra-node" and IB.scope == "inter-node"
    assert get_link("nvlink4") is NVLINK


def test_no_two_presets_are_the_same_link_except_nvswitch() -> None:
    """Issue 33: PCIe's line hid under InfiniBand's (identical presets). Only NVSwitch shares
    NVLink 4's per-GPU rate, by design (the switch gives every pair the full NVLink rate)."""
    seen: dict[tuple[float, float], str] = {}
    for name, link in INTERCONNECTS.items():
        key = (link.alpha_s, link.bandwidth_Bps)
        assert key not in seen or {seen[key], name} == {"nvlink4", "nvswitch"}, (seen.get(key), name)
        seen.setdefault(key, name)
    assert INTERCONNECTS["nvswitch"].bandwidth_Bps == NVLINK.bandwidth_Bps


def test_this_machine_turns_a_fit_into_a_link() -> None:
    """A fitted AlphaBeta becomes an Interconnect that predicts the same times."""
    link = this_machine(AlphaBeta(3e-5, 2e9, world_size=4, r_squared=0.99))
    assert (link.alpha_s, link.bandwidth_Bps, link.scope) == (3e-5, 2e9, "intra-node")
    assert "4 ranks" in link.note and "0.990" in link.note


def test_dp_step_is_compute_plus_exposed_all_reduce() -> None:
    """DP: ring all-reduce of params x bytes; overlap hides that share of it."""
    plain = predict_step_time("dp", params=1e9, compute_s=0.5, world_size=8, link=IB)
    comm = ring_allreduce_time(2e9, 8, IB.alpha_s, IB.bandwidth_Bps)
    assert plain.comm_s == pytest.approx(comm)
    assert plain.total_s == pytest.approx(0.5 + comm)
    assert plain.efficiency == pytest.approx(0.5 / (0.5 + comm))
    half = predict_step_time("dp", params=1e9, compute_s=0.5, world_size=8, link=IB,
                             overlap=0.5)
    assert half.comm_s == pytest.approx(comm / 2) and half.hidden_comm_s == pytest.approx(comm / 2)
    fp32 = predict_step_time("dp", params=1e9, compute_s=0.5, world_size=8, link=IB,
                             bytes_per_value=4)
    assert fp32.comm_s > plain.comm_s  # bf16 gradients halve the bytes on the wire


def test_compute_can_come_from_flops() -> None:
    """compute_s = flops per step per device / achieved device FLOP/s."""
    pred = predict_step_time("dp", params=1e6, flops_per_step_per_device=4e14,
                             device_flops_per_s=2e14, world_size=1, link=NVLINK)
    assert pred.compute_s == pytest.approx(2.0)
    assert pred.comm_s == 0.0 and pred.efficiency == 1.0


def test_tp_is_four_all_reduces_of_bsh_per_layer() -> None:
    """Megatron TP: 2 all-reduces forward + 2 backward per layer, each b*s*h values."""
    pred = predict_step_time("tp", compute_s=1.0, world_size=8, link=NVLINK, batch=4,
                             seq=1024, hidden=4096, layers=10)
    one = ring_allreduce_time(4 * 1024 * 4096 * 2, 8, NVLINK.alpha_s, NVLINK.bandwidth_Bps)
    assert pred.comm_s == pytest.approx(40 * one)
    assert pred.total_s == pytest.approx(1.0 + 40 * one)


def test_pp_step_is_m_plus_p_minus_1_slots() -> None:
    """PP: (m + p - 1) slots of compute/m plus 2 activation-sized sends per microbatch."""
    pred = predict_step_time("pp", compute_s=0.8, world_size=4, link=IB, batch=2, seq=512,
                             hidden=1024, microbatches=8)
    t_msg = IB.alpha_s + 2 * 512 * 1024 * 2 / IB.bandwidth_Bps
    slot = 0.8 / 8 + 2 * t_msg
    assert pred.total_s == pytest.approx(11 * slot)
    assert pred.bubble_s == pytest.approx(3 * slot)
    assert pred.comm_s == pytest.approx(16 * t_msg)
    assert pred.compute_s + pred.comm_s + pred.bubble_s == pytest.approx(pred.total_s)


def test_tp_inside_the_node_pp_across_nodes() -> None:
    """The rule of thumb: TP over NVLink is cheap, TP over InfiniBand is not, while PP
    tolerates InfiniBand (a 70B-ish model, 8 GPUs, 2.15 s of compute per step)."""
    tp = {"compute_s": 2.15, "world_size": 8, "batch": 8, "seq": 2048, "hidden": 8192,
          "layers": 80}
    tp_nvlink = predict_step_time("tp", link=NVLINK, **tp)
    tp_ib = predict_step_time("tp", link=IB, **tp)
    pp_ib = predict_step_time("pp", compute_s=2.15, world_size=8, link=IB, batch=1,
                              seq=2048, hidden=8192, microbatches=32)
    assert tp_nvlink.efficiency > 0.8
    assert tp_ib.efficiency < 0.4
    assert pp_ib.efficiency > 2 * tp_ib.efficiency


@pytest.mark.parametrize(
    ("call", "names"),
    [
        (lambda: get_link("token_ring"), "link ('token_ring')"),
        (lambda: this_machine(AlphaBeta(1e-5, 1e9), scope="rack"), "scope ('rack')"),
        (lambda: predict_step_time("fsdp", params=1e9, compute_s=1, world_size=8, link=IB),
         "strategy ('fsdp')"),
        (lambda: predict_step_time("dp", compute_s=1, world_size=8, link=IB), "params (None)"),
        (lambda: predict_step_time("dp", params=1e9, world_size=8, link=IB), "compute_s (None)"),
        (lambda: predict_step_time("dp", params=1e9, compute_s=1, world_size=8, link="ib"),
         "link ('ib')"),
        (lambda: predict_step_time("dp", params=1e9, compute_s=1, world_size=8, link=IB,
                                   overlap=1.5), "overlap (1.5)"),
        (lambda: predict_step_time("dp", params=1e9, compute_s=1, world_size=0, link=IB),
         "world_size (0)"),
        (lambda: predict_step_time("tp", compute_s=1, world_size=8, link=IB, layers=2),
         "hidden (None)"),
        (lambda: predict_step_time("tp", compute_s=1, world_size=8, link=IB, hidden=64),
         "layers (None)"),
        (lambda: predict_step_time("pp", compute_s=1, world_size=4, link=IB, hidden=64),
         "microbatches (None)"),
    ],
)
def test_bad_input_raises_config_error_naming_the_value(call, names: str) -> None:
    """Every bad argument raises ConfigError whose message names the value and an example."""
    with pytest.raises(ConfigError) as info:
        call()
    assert names in str(info.value)
    assert "e.g." in str(info.value)
