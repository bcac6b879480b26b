"""The self-test's device rows on recorded, GPU-like inputs: datasheets, the allocator's peak
against ZeRO, CUDA events, ``nvidia-smi topo -m`` and the CPU's NUMA nodes.

Every number and every ``nvidia-smi`` text below is a FIXTURE written for these tests in the
format the real tools print -- not a measurement of any machine. Real GPU numbers live in
docs/benchmarks.md with the device named.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.selftest import judge_devices as jd
from labkit.selftest.datasheet import datasheet_for
from labkit.selftest.rows import FAIL, PASS
from labkit.selftest.topology import (
    link_kind,
    numa_nodes,
    parse_topo,
    slowest_link,
    tp_placement,
    visible_gpu_ids,
)

pytestmark = [pytest.mark.lesson00]
MiB = 2**20

# FIXTURE: an 8-GPU NVLink server (NV18 everywhere), two NICs, the header underlined with the
# ANSI codes recent nvidia-smi prints, tab-separated like the real output.
TOPO_HGX = ("\t\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tNIC0\tNIC1\tCPU Affinity"
            "\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
            + "".join(f"GPU{i}\t" + "\t".join(" X " if j == i else "NV18" for j in range(8))
                      + f"\t{'PXB' if i < 4 else 'SYS'}\t{'SYS' if i < 4 else 'PXB'}"
                      + f"\t{'0-47' if i < 4 else '48-95'}\t{0 if i < 4 else 1}\t\tN/A\n"
                      for i in range(8))
            + "NIC0\tPXB\tPXB\tPXB\tPXB\tSYS\tSYS\tSYS\tSYS\t X \tSYS\n"
            + "\nLegend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the SMP "
            "interconnect between NUMA nodes (e.g., QPI/UPI)\n  NV#  = Connection traversing a "
            "bonded set of # NVLinks\n")

# FIXTURE: 4 PCIe GPUs, two pairs on NVLink bridges (NV4), the pairs in two NUMA nodes.
TOPO_PAIRS = """\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tNV4\tSYS\tSYS\t0-15\t0\t\tN/A
GPU1\tNV4\t X \tSYS\tSYS\t0-15\t0\t\tN/A
GPU2\tSYS\tSYS\t X \tNV4\t16-31\t1\t\tN/A
GPU3\tSYS\tSYS\tNV4\t X \t16-31\t1\t\tN/A

Legend:
"""

# FIXTURE: one GPU.
TOPO_ONE = "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \t0-7\t0\t\tN/A\n\nLegend:\n"


# ---- datasheets -------------------------------------------------------------------------------
@pytest.mark.parametrize("name, model, fp32_t, bf16_t", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 67, 989), ("NVIDIA H100 PCIe", "H100 PCIe", 51, 756),
    ("NVIDIA H100 NVL", "H100 NVL", 60, 835), ("NVIDIA H200", "H200 SXM", 67, 989),
    ("NVIDIA GH200 480GB", "GH200 (H100 SXM class)", 67, 989),
    ("NVIDIA A100-SXM4-80GB", "A100", 19.5, 312), ("NVIDIA A100 80GB PCIe", "A100", 19.5, 312),
    ("NVIDIA L40S", "L40S", 91.6, 362), ("NVIDIA L4", "L4", 30.3, 121),
    ("NVIDIA A10", "A10", 31.2, 125)])
def test_datasheet_matches_the_names_torch_reports(name, model, fp32_t, bf16_t):
    """Dense peaks (the datasheets' "with sparsity" tensor rates halved)."""
    sheet = datasheet_for(name)
    assert sheet is not None and sheet.model == model
    assert (sheet.fp32_flops / 1e12, sheet.bf16_flops / 1e12) == (fp32_t, bf16_t)


def test_an_unknown_gpu_has_no_datasheet_and_its_row_shows_the_measurement_alone():
    assert datasheet_for("Tesla T4") is None and datasheet_for("NVIDIA GeForce RTX 4090") is None
    row = jd.datasheet_peak("bf16", "Tesla T4", 40e12, None)
    assert row.status == PASS and "not in labkit.selftest.datasheet" in row.note


def test_datasheet_row_passes_a_healthy_gpu_and_names_what_is_wrong_otherwise():
    h100 = datasheet_for("NVIDIA H100 80GB HBM3")
    ok = jd.datasheet_peak("bf16", "NVIDIA H100 80GB HBM3", 700e12, h100)
    assert ok.status == PASS and ok.off_by == "71% of the datasheet"
    tf32 = jd.datasheet_peak("fp32", "NVIDIA H100 80GB HBM3", 350e12, h100)
    assert tf32.status == FAIL and "allow_tf32" in tf32.note
    slow = jd.datasheet_peak("bf16", "NVIDIA H100 80GB HBM3", 100e12, h100)
    assert slow.status == FAIL and "power" in slow.note


def test_cuda_event_row_fails_when_events_and_host_disagree():
    assert jd.cuda_event_timing(0.050, 0.0502).status == PASS
    bad = jd.cuda_event_timing(0.020, 0.050)
    assert bad.status == FAIL and bad.off_by == "-60.0%"


# ---- GPU memory against ZeRO -------------------------------------------------------------------
def test_gpu_memory_row_names_the_phase_that_sets_the_peak_and_the_overhead():
    """FIXTURE numbers shaped like ZeRO-1 of a 4096 x 8 MLP on 2 GPUs (117M weights)."""
    states = 1_400 * MiB
    phases = {"forward/backward": 170 * MiB, "end-of-run gather": 470 * MiB}
    row = jd.gpu_memory(1, "fp32", int(states + 470 * MiB + 90 * MiB), states, phases)
    assert row.status == PASS and row.off_by.startswith("+90 MiB")
    assert row.values["peak_phase"] == "end-of-run gather" and "512-byte rounding" in row.note
    assert "states 1400 + end-of-run gather 470" in row.expected



def test_a_passing_memory_row_does_not_call_a_large_leftover_rounding():
    """The H200's ZeRO-2 bf16 run: +385 MiB (+17 %) over 2308 MiB predicted passes inside the
    slack, but rounding cannot explain it, so the row says an unnamed buffer did."""
    states, phases = 1_795 * MiB, {"end-of-run gather": 513 * MiB}
    row = jd.gpu_memory(2, "bf16", int((1_795 + 513 + 385) * MiB), states, phases)
    assert row.status == PASS and "more than rounding" in row.note
    assert "512-byte rounding" not in row.note


def test_gpu_memory_row_fails_below_the_states_or_far_from_the_prediction():
    states, phases = 1_000 * MiB, {"forward/backward": 100 * MiB}
    under = jd.gpu_memory(3, "fp32", 900 * MiB, states, phases)
    assert under.status == FAIL and "less than the model states" in under.note
    over = jd.gpu_memory(3, "fp32", 1_400 * MiB, states, phases)
    assert over.status == FAIL and "more than the allocator" in over.note
    short = jd.gpu_memory(3, "fp32", 1_000 * MiB, states, {"end-of-run gather": 500 * MiB})
    assert short.status == FAIL and "did not allocate" in short.note


def test_zero_phases_count_the_end_of_run_gather_of_the_whole_fp32_model():
    """Psi = 55,050 for the lab's default MLP (32 -> 128 x 4 -> 10): 4 Psi bytes are gathered
    at the end, plus the largest layer (128 x 128 + 128) once."""
    from labkit.config.run import ModelConfig
    from labkit.selftest.gpu import zero_phases

    model = ModelConfig()
    phases = zero_phases(model, 32, transient=1000, activations=2000)
    largest = 4 * (128 * 128 + 128)
    assert phases["end-of-run gather"] == 4 * 55_050 + largest
    assert phases["forward/backward"] == 1000 + 2000 + 32 * (32 * 4 + 8) + largest


# ---- nvidia-smi topo -m --------------------------------------------------------------------------
def test_parse_topo_reads_the_gpu_matrix_past_nics_and_ansi_codes():
    topo = parse_topo(TOPO_HGX)
    assert topo.gpus == [f"GPU{i}" for i in range(8)]
    assert topo.links[(0, 7)] == "NV18" and len(topo.links) == 8 * 7
    assert topo.numa[0] == "0" and topo.numa[7] == "1"


def test_tp_placement_keeps_tp_groups_on_nvlink():
    pairs = parse_topo(TOPO_PAIRS)
    assert slowest_link(pairs, [0, 1]) == "NV4" and slowest_link(pairs, [1, 2]) == "SYS"
    two, four = tp_placement(pairs)
    assert two.startswith("TP=2: slowest link NV4") and "good" in two
    assert four.startswith("TP=4: slowest link SYS") and "avoid" in four
    assert all("good" in s for s in tp_placement(parse_topo(TOPO_HGX)))
    assert "not possible" in tp_placement(parse_topo(TOPO_ONE))[0]
    assert link_kind("NV12") == "NV" and link_kind("PHB") == "PHB"


def test_topology_row_places_tp_for_the_visible_gpus_only():
    """CUDA_VISIBLE_DEVICES=1,2 on the pairs server: TP=2 crosses SYS there."""
    row = jd.gpu_topology(parse_topo(TOPO_PAIRS), [1, 2], 2)
    assert row.status == PASS and "TP=2: slowest link SYS" in row.note
    missing = jd.gpu_topology(parse_topo(TOPO_ONE), [0, 1], 2)
    assert missing.status == FAIL and "not in the nvidia-smi matrix" in missing.note


def test_parse_topo_rejects_text_without_a_gpu_matrix():
    with pytest.raises(ValueError, match="no GPU0 column"):
        parse_topo("NVIDIA-SMI has failed because it couldn't communicate with the driver")


def test_visible_gpu_ids_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert visible_gpu_ids(2) == [2, 3]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8e7f,GPU-1a2b")  # UUIDs: order unknown
    assert visible_gpu_ids(2) == [0, 1]


# ---- the CPU -----------------------------------------------------------------------------------------
def test_numa_nodes_read_sysfs_cpulists(tmp_path: Path):
    for node, cpus in ((0, "0-3,8-11\n"), (1, "4-7,12-15\n")):
        (tmp_path / f"node{node}").mkdir()
        (tmp_path / f"node{node}" / "cpulist").write_text(cpus)
    nodes = numa_nodes(tmp_path)
    assert nodes == {0: [0, 1, 2, 3, 8, 9, 10, 11], 1: [4, 5, 6, 7, 12, 13, 14, 15]}
    row = jd.cpu_topology(nodes, [0, 1, 4], 2)
    assert row.status == PASS and "fits inside node(s) [0]" in row.note


def test_cpu_row_fails_with_fewer_cores_than_ranks():
    row = jd.cpu_topology({0: [0]}, [0], 2)
    assert row.status == FAIL and row.off_by == "-1 cores" and "waiting for a core" in row.note
