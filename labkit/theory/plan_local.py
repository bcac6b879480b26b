""""This machine" as the planner's cluster: measured compute and a fitted wire (issue 38, item 4).

Teaches that the planner's cluster is only numbers, and that a laptop's can be measured
instead of read off a datasheet: the same ``labkit.theory.plan.predict`` that rates Llama 3
405B on 16,384 H100s rates the lab's own GPT on the student's cores.

* **Compute**: ``labkit calibrate`` caches this machine's fp32 ``torch.mm`` rate for every
  shape it measured, the model's own GEMM shapes included (``labkit.analysis.throughput.
  gemm_shapes``). ``gemm_rate`` combines those of one rank's step into the rate the step's
  matmuls run at: total FLOPs over the sum of each shape's FLOPs at its own rate (a harmonic
  mean, weighted by FLOPs), measured with the threads all ranks use together (at most the
  cores); the ranks share it, so each computes at ``rate / ranks``. That rate plays the
  role of a GPU's peak x MAMF (``mamf`` = 1: it already is the rate of the model's shapes).
* **Wire**: the alpha-beta fitted to the built-in all-reduce of this machine
  (``labkit.theory.fit_alpha_beta``, ``labkit.lessons.dedicated.machine_wire``): latency per
  message and bandwidth as measured, so the planner's ``LINK_EFFICIENCY`` (a datasheet's
  discount) is undone here: the measured bandwidth is what a collective reaches.
* **Memory**: the machine's RAM shared by its ranks.

The planner's own constants are kept (``COMPUTE_EFFICIENCY`` for the non-GEMM work of a
step, the 1F1B bubble, exposed TP collectives); nothing is fitted to a step time.
"""

from __future__ import annotations

from collections.abc import Mapping

from labkit.base.errors import ConfigError
from labkit.theory.interconnect import Interconnect
from labkit.theory.plan_models import GPU, Cluster
from labkit.theory.plan_terms import LINK_EFFICIENCY

Shape = tuple[int, int, int]


def gemm_rate(rates: Mapping[str, float], shapes: list[Shape]) -> float:
    """FLOP/s of a step's matmuls: ``sum(2 m k n) / sum(2 m k n / rate(shape))`` over
    ``shapes``, each rate read from calibrate's ``"mxkxn"`` keys."""
    missing = [s for s in shapes if f"{s[0]}x{s[1]}x{s[2]}" not in rates]
    if not shapes or missing:
        raise ConfigError(f"the calibration holds no rate for the shapes {missing or shapes}; "
                          f"run `labkit calibrate` (it measures a run's shapes), e.g. "
                          f"shapes=[(512, 64, 192)]")
    flops = [2.0 * m * k * n for m, k, n in shapes]
    seconds = sum(f / rates[f"{m}x{k}x{n}"] for f, (m, k, n) in zip(flops, shapes, strict=True))
    return sum(flops) / seconds


def measured_cluster(*, rate_flops_per_s: float, alpha_s: float, bandwidth_Bps: float,
                     ranks: int, memory_bytes: float) -> Cluster:
    """``ranks`` processes of one machine as a one-node cluster: each computes at
    ``rate_flops_per_s`` (its share already), all talk over one fitted wire."""
    for name, value in (("rate_flops_per_s", rate_flops_per_s), ("bandwidth_Bps", bandwidth_Bps),
                        ("memory_bytes", memory_bytes)):
        if not value > 0:
            raise ConfigError(f"{name} ({value!r}) must be > 0; e.g. {name}=1e9")
    if alpha_s < 0:
        raise ConfigError(f"alpha_s ({alpha_s!r}) must be >= 0 seconds; e.g. alpha_s=5e-5")
    wire = Interconnect("this machine", alpha_s, bandwidth_Bps / LINK_EFFICIENCY, "intra-node",
                        "alpha-beta fitted to this machine's all-reduce (bandwidth as measured)")
    device = GPU("this machine", rate_flops_per_s, rate_flops_per_s, memory_bytes / ranks, wire,
                 1.0, "calibrated fp32 torch.mm rate at the model's GEMM shapes, per rank")
    return Cluster(device, ranks, ranks, wire, wire)
