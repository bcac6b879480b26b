"""Lesson 10's predictions: the alpha-beta model of the link, beside every measurement.

Pure Python (no torch, no processes). The link is described by what the probe measured
(``metrics["link"]``: TCP goodput and half the round trip) or, where no cluster can run,
by the preset itself (``labkit.config.links``). Conventions: seconds, bytes, per step;
"exposed" communication is communication no compute hid (the step waits for it).

* DDP: one ring all-reduce of the gradients per step, ``2(n-1)*alpha + 2(n-1)/n * S / B``
  (``labkit.theory.ring_allreduce_time``); the rest of the step is what the run itself
  measured outside communication (compute, optimizer, Python).
* Flat ring across k nodes of m ranks: each node's uplink carries ``2(n-1)/n * S``, with
  ``2(n-1)`` latency-bound steps; hierarchical: ``2(k-1)/k * S`` and ``2(k-1)`` steps on
  the link (``labkit.strategies.collectives.hierarchical``).
"""

from __future__ import annotations

from typing import Any

from labkit.base.events import Lane
from labkit.config.links import LinkSpec, as_interconnect
from labkit.theory.comm import ring_allreduce_time
from labkit.theory.interconnect import Interconnect


def link_model(link: dict[str, Any] | LinkSpec) -> Interconnect:
    """The alpha-beta link: measured where the probe ran, else the preset's own figures."""
    if isinstance(link, LinkSpec):
        return Interconnect(link.text, link.latency_s, link.bytes_per_s, "inter-node",
                            "the preset (not measured: no emulated cluster here)")
    return as_interconnect(link)


def step_parts(result: Any) -> dict[str, float]:
    """Per step, means over ranks, first step skipped: step_s, compute_s, comm_s, exposed_s,
    other_s (the step minus compute and exposed communication)."""
    tl = result.timeline
    window = tl.window()
    steps = max(1, len(window.steps()))
    ranks = window.ranks or [0]
    comm = sum(window.comm_ns(r) for r in ranks) / len(ranks) / 1e9 / steps
    hidden = sum(window.overlap_ns(r) for r in ranks) / len(ranks) / 1e9 / steps
    compute = sum(window.compute_ns(r) for r in ranks) / len(ranks) / 1e9 / steps
    step = result.step_time_s
    exposed = comm - hidden
    return {"step_s": step, "compute_s": compute, "comm_s": comm, "exposed_s": exposed,
            "other_s": max(0.0, step - compute - exposed)}


def allreduce_s(size_bytes: float, world_size: int, link: Interconnect) -> float:
    """Ring all-reduce time of ``size_bytes`` over ``link`` (alpha-beta)."""
    return ring_allreduce_time(size_bytes, world_size, link.alpha_s, link.bandwidth_Bps)


def flat_vs_hierarchical(size_bytes: float, nodes: int, ranks_per_node: int,
                         link: Interconnect) -> dict[str, float]:
    """Seconds on the slow link of a flat ring over all ranks vs the hierarchical scheme
    (the intra-node phases run on loopback and are left out: the link is the wall)."""
    n, k = nodes * ranks_per_node, nodes
    flat = 2 * (n - 1) * link.alpha_s + 2 * (n - 1) / n * size_bytes / link.bandwidth_Bps
    hier = 2 * (k - 1) * link.alpha_s + 2 * (k - 1) / k * size_bytes / link.bandwidth_Bps
    return {"flat_s": flat, "hierarchical_s": hier, "speedup": flat / hier if hier else 1.0}


def comm_events_bytes(result: Any, axis: str | None = None) -> float:
    """Payload bytes rank 0 moved per step (optionally on one axis), first step skipped."""
    window = result.timeline.window()
    steps = max(1, len(window.steps()))
    total = sum(e.bytes or 0 for e in window.events if e.rank == 0 and e.lane == Lane.COMM
                and (axis is None or e.axis == axis))
    return total / steps
