"""How this machine's devices are wired, and what that means for tensor parallelism.

Tensor parallelism all-reduces activations twice per layer in forward and twice in backward
(Megatron-LM, Shoeybi et al. 2019), so its group must sit on the fastest links; data and
pipeline parallelism tolerate slower ones. labkit's grid puts tp fastest (consecutive ranks,
one GPU each), so a TP group of size t is GPUs ``(0..t-1), (t..2t-1), ...``.

On a GPU server we read ``nvidia-smi topo -m`` (its legend: ``NV#`` a bonded set of # NVLinks,
``PIX`` at most one PCIe bridge, ``PXB`` several PCIe bridges, ``PHB`` through a PCIe host
bridge (the CPU), ``NODE`` between host bridges in one NUMA node, ``SYS`` across the SMP
interconnect between NUMA nodes) and say, for each TP size, the slowest link inside its
groups. On a CPU we read the NUMA nodes from sysfs: ranks talk through shared memory, and a
run is fair while there is a core per rank.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

LINK_RANK = {"NV": 0, "PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5, "SOC": 5}
"""Links from fastest to slowest (``SOC`` is older drivers' name for ``SYS``)."""
LINK_MEANING = {
    "NV": "NVLink", "PIX": "one PCIe switch", "PXB": "several PCIe switches",
    "PHB": "through the CPU's PCIe host bridge", "NODE": "across PCIe host bridges, one NUMA node",
    "SYS": "across NUMA nodes (QPI/UPI)", "SOC": "across NUMA nodes (QPI/UPI)"}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # recent nvidia-smi underlines the header


@dataclass
class GpuTopology:
    """The GPU-to-GPU part of ``nvidia-smi topo -m``."""

    gpus: list[str]
    links: dict[tuple[int, int], str]
    """(i, j) -> the legend code between GPU i and GPU j (i != j)."""
    numa: dict[int, str] = field(default_factory=dict)
    """GPU -> its NUMA affinity, where printed."""


def link_kind(code: str) -> str:
    """``NV18`` -> ``NV``; the legend code otherwise (unknown codes are kept)."""
    return "NV" if code.startswith("NV") else code


def parse_topo(text: str) -> GpuTopology:
    """Read the matrix of ``nvidia-smi topo -m`` (GPU rows only; NIC rows are ignored)."""
    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    header_at = next((i for i, line in enumerate(lines) if re.search(r"\bGPU0\b", line)), None)
    if header_at is None:
        raise ValueError("no GPU0 column in the nvidia-smi topo -m output")
    header = lines[header_at].split()
    columns = header[:header.index("CPU")] if "CPU" in header else header
    gpu_cols = [c for c in columns if re.fullmatch(r"GPU\d+", c)]
    links: dict[tuple[int, int], str] = {}
    numa: dict[int, str] = {}
    for line in lines[header_at + 1:]:
        tokens = line.split()
        if not tokens:
            break  # the legend follows a blank line
        name = tokens[0]
        if not re.fullmatch(r"GPU\d+", name) or name not in gpu_cols:
            continue
        i = gpu_cols.index(name)
        cells = tokens[1:1 + len(columns)]
        for col, code in zip(columns, cells):
            if col in gpu_cols and col != name:
                links[(i, gpu_cols.index(col))] = code
        rest = tokens[1 + len(columns):]
        if len(rest) >= 2:
            numa[i] = rest[1]
    if not links and len(gpu_cols) > 1:
        raise ValueError("nvidia-smi topo -m listed GPUs but no links between them")
    return GpuTopology(gpus=gpu_cols, links=links, numa=numa)


def slowest_link(topo: GpuTopology, group: list[int]) -> str | None:
    """The slowest legend code between any two GPUs of ``group`` (None for one GPU)."""
    codes = [topo.links[(a, b)] for a in group for b in group if a != b and (a, b) in topo.links]
    if not codes:
        return None
    return max(codes, key=lambda c: LINK_RANK.get(link_kind(c), 9))


def tp_placement(topo: GpuTopology, gpus: list[int] | None = None) -> list[str]:
    """One sentence per TP size 2, 4, 8 that fits: the slowest link inside its groups of
    consecutive GPUs (labkit's grid puts tp fastest), and whether TP belongs there."""
    order = gpus if gpus is not None else list(range(len(topo.gpus)))
    if len(order) < 2:
        return ["one GPU: tensor parallelism across GPUs is not possible here (the 2-rank "
                "lessons run on gloo)"]
    out = []
    for t in (2, 4, 8):
        if t > len(order):
            break
        groups = [order[k:k + t] for k in range(0, len(order) - t + 1, t)]
        worst = max((slowest_link(topo, g) or "X" for g in groups),
                    key=lambda c: LINK_RANK.get(link_kind(c), 9))
        kind = link_kind(worst)
        fit = ("good: NVLink inside every group" if kind == "NV" else
               "works, PCIe-bound: keep TP small" if kind in ("PIX", "PXB") else
               "avoid: put data or pipeline parallelism on these links instead")
        out.append(f"TP={t}: slowest link {worst} ({LINK_MEANING.get(kind, 'unknown')}): {fit}")
    return out


def nvidia_smi_topo(timeout_s: float = 20.0) -> str | None:
    """The output of ``nvidia-smi topo -m``, or None where nvidia-smi is missing or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def visible_gpu_ids(count: int) -> list[int]:
    """Physical GPU indices behind ``cuda:0..count-1`` (CUDA_VISIBLE_DEVICES, numeric ids)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        if all(v.isdigit() for v in ids):
            return [int(v) for v in ids[:count]]
    return list(range(count))


def _parse_cpulist(text: str) -> list[int]:
    cpus: list[int] = []
    for part in text.strip().split(","):
        if "-" in part:
            a, b = part.split("-")
            cpus += range(int(a), int(b) + 1)
        elif part:
            cpus.append(int(part))
    return cpus


def numa_nodes(root: Path = Path("/sys/devices/system/node")) -> dict[int, list[int]]:
    """NUMA node -> its CPUs, from sysfs (empty where sysfs does not say)."""
    nodes: dict[int, list[int]] = {}
    for node in sorted(root.glob("node[0-9]*")):
        try:
            nodes[int(node.name[4:])] = _parse_cpulist((node / "cpulist").read_text())
        except (OSError, ValueError):
            continue
    return nodes
