"""Lesson 10's predictions: the alpha-beta model of the link, beside every measurement.

Pure Python (no torch, no processes). The link is described by what the probe measured
(``metrics["link"]``: TCP goodput and half the round trip) or, where no cluster can run,
by the preset itself (``labkit.config.links``); loopback inside a node by an all-reduce
benchmark (``loopback_model``). Conventions: seconds, bytes, per step (the fastest step after
the first: ``step_parts``); "exposed" communication is communication no compute hid (the step
waits for it).

* DDP: one ring all-reduce of the gradients per step, ``2(n-1)*alpha + 2(n-1)/n * S / B``
  (``labkit.theory.ring_allreduce_time``); the rest of the step is what the run itself
  measured outside communication (compute, optimizer, Python).
* Flat ring across k nodes of m ranks: each node's uplink carries ``2(n-1)/n * S``, with
  ``2(n-1)`` latency-bound steps; hierarchical: ``2(k-1)/k * S`` and ``2(k-1)`` steps on
  the link (``labkit.strategies.collectives.hierarchical``).
"""

from __future__ import annotations

import statistics
from typing import Any

from labkit.base.errors import ConfigError, LabError
from labkit.base.events import Lane, Op
from labkit.config.links import LinkSpec, as_interconnect
from labkit.theory.comm import BUSBW_FACTORS, fit_alpha_beta, ring_allreduce_time
from labkit.theory.interconnect import Interconnect


def link_model(link: dict[str, Any] | LinkSpec) -> Interconnect:
    """The alpha-beta link: measured where the probe ran, else the preset's own figures."""
    if isinstance(link, LinkSpec):
        return Interconnect(link.text, link.latency_s, link.bytes_per_s, "inter-node",
                            "the preset (not measured: no emulated cluster here)")
    return as_interconnect(link)


def step_parts(result: Any) -> dict[str, float]:
    """The fastest step after the first (the one other programs on this machine disturbed
    least; the first pays for warm-up), means over ranks: step_s, compute_s, comm_s,
    exposed_s, other_s (the step minus compute and exposed communication), and
    median_step_s for comparison. A step's time runs from the first rank's start to the
    last rank's end."""
    tl = result.timeline
    steps, times = tl.steps(), tl.step_times_s()
    pairs = list(zip(steps, times))[1:] or list(zip(steps, times))
    if not pairs:
        return {"step_s": result.step_time_s, "compute_s": 0.0, "comm_s": 0.0,
                "exposed_s": 0.0, "other_s": result.step_time_s,
                "median_step_s": result.step_time_s}
    fastest, step = min((t, s) for s, t in pairs)
    window = tl.window([step])
    ranks = window.ranks or [0]
    comm = sum(window.comm_ns(r) for r in ranks) / len(ranks) / 1e9
    hidden = sum(window.overlap_ns(r) for r in ranks) / len(ranks) / 1e9
    compute = sum(window.compute_ns(r) for r in ranks) / len(ranks) / 1e9
    exposed = comm - hidden
    return {"step_s": fastest, "compute_s": compute, "comm_s": comm, "exposed_s": exposed,
            "other_s": max(0.0, fastest - compute - exposed),
            "median_step_s": statistics.median(t for _, t in pairs)}


def allreduce_s(size_bytes: float, world_size: int, link: Interconnect) -> float:
    """Ring all-reduce time of ``size_bytes`` over ``link`` (alpha-beta)."""
    return ring_allreduce_time(size_bytes, world_size, link.alpha_s, link.bandwidth_Bps)


def flat_vs_hierarchical(size_bytes: float, nodes: int, ranks_per_node: int,
                         link: Interconnect) -> dict[str, float]:
    """Seconds on the slow link of a flat ring over all ranks vs the hierarchical scheme
    (the intra-node phases run on loopback and are left out: the link is the wall)."""
    n, k = nodes * ranks_per_node, nodes
    flat, hier = allreduce_s(size_bytes, n, link), allreduce_s(size_bytes, k, link)
    return {"flat_s": flat, "hierarchical_s": hier, "speedup": flat / hier if hier else 1.0}


def comm_events_bytes(result: Any, axis: str | None = None) -> float:
    """Payload bytes rank 0 moved per step (optionally on one axis), first step skipped."""
    window = result.timeline.window()
    steps = max(1, len(window.steps()))
    total = sum(e.bytes or 0 for e in window.events if e.rank == 0 and e.lane == Lane.COMM
                and (axis is None or e.axis == axis))
    return total / steps


def loopback_model(bench: Any) -> Interconnect:
    """Loopback inside one node, measured the way lesson 01 measures it: the alpha-beta line
    fitted to an all-reduce benchmark of 2 ranks, through the *fastest* call of each size
    (read from the trace; warm-up calls skipped). The fastest call is the one no other
    program delayed: on a busy laptop the median carries waits for a core, which are not
    the wire's."""
    opts = bench.config.options
    per_size: dict[int, list[tuple[int, int]]] = {}
    for e in bench.timeline.select(rank=0, op=Op.ALL_REDUCE):
        if e.name != "timing" and e.bytes:
            per_size.setdefault(int(e.bytes), []).append((e.start_ns, e.dur_ns))
    sizes = sorted(per_size)
    fastest = [min(d for _, d in sorted(per_size[b])[opts.warmup:] or per_size[b]) / 1e9
               for b in sizes]
    try:
        fit = fit_alpha_beta(sizes, fastest, 2)
        alpha, bandwidth = fit.alpha_s, fit.bandwidth_Bps
    except ConfigError:  # too few sizes traced: the benchmark's own (median) fit
        ab = bench.metrics["alpha_beta"]
        if ab is None:  # even the fastest calls did not grow with the size
            raise LabError(f"the loopback all-reduce's fastest calls did not grow with the "
                           f"message size ({[round(t * 1e3, 3) for t in fastest]} ms for "
                           f"{sizes} bytes), so no alpha-beta line fits them: the machine is "
                           f"too busy to measure its wire; close other programs and run the "
                           f"cell again") from None
        alpha, bandwidth = float(ab["alpha_s"]), float(ab["bandwidth_gbps"]) * 1e9
    return Interconnect("loopback", alpha, bandwidth, "intra-node",
                        "gloo between 2 ranks of one node, fastest calls, measured here")


def node_uplink_bytes(timeline: Any, ranks_per_node: int, step: int) -> list[float]:
    """Bytes each node sent over the link between nodes during ``step`` (a ``with
    ctx.step(step)`` span on every rank), counted from the trace, one number per node.

    Nodes are ranks ``k*ranks_per_node .. (k+1)*ranks_per_node - 1`` (torchrun's numbering).
    A send to a rank of another node counts its bytes; a collective on the "inter" axis (one
    rank per node: ``RankContext.node_comms``) counts what each rank sends in a ring, the
    nccl-tests factor times its payload (``2(k-1)/k`` for an all-reduce over k nodes). Every
    other op stays inside its node and counts nothing."""
    nodes = timeline.world_size // ranks_per_node
    out = [0.0] * nodes
    for span in (e for e in timeline.events if e.op == Op.STEP and e.step == step):
        for e in timeline.events:
            if e.rank != span.rank or e.lane != Lane.COMM or not (
                    span.start_ns <= e.start_ns and e.end_ns <= span.end_ns):
                continue
            node = e.rank // ranks_per_node
            if e.op == Op.SEND and e.peer is not None and e.peer // ranks_per_node != node:
                out[node] += e.bytes or 0
            elif e.axis == "inter" and e.op.value in BUSBW_FACTORS:
                out[node] += BUSBW_FACTORS[e.op.value](nodes) * (e.bytes or 0)
    return out


FREE_BPS = 1e30
"""A bandwidth that costs nothing per byte (finite: the theory's formulas check for it)."""


def extra_link(link: Interconnect, loopback: Interconnect) -> Interconnect:
    """What a message pays on ``link`` beyond what it paid on loopback, as a link of its own.

    Moving a run from one node to two changes only the wire: compute, Python, the gloo
    library and the waits for a core stay. Per message the wire adds its one-way latency,
    and per byte the difference of the two transfer times, ``1/B_link - 1/B_loopback``.
    Neither can be negative: a slower wire never makes a step shorter. So a prediction is
    the step measured inside one node plus the communication priced on this link, never
    less than the step inside the node (``placement``, ``ddp_across_links``).
    """
    per_byte = 1 / link.bandwidth_Bps - 1 / loopback.bandwidth_Bps
    return Interconnect(f"{link.name} beyond loopback", max(0.0, link.alpha_s),
                        1 / per_byte if per_byte > 0 else FREE_BPS, "inter-node",
                        "the link's latency, and its transfer time minus loopback's")


CONTENDED = 3.0
"""A measured communication time this many times what its wire needs is mostly waiting for
the peer (a rank waiting for a core), not moving bytes."""


def contention(measured_comm_s: float, wire_s: float) -> float | None:
    """Measured communication over what the wire needs (alpha-beta), where that is at least
    ``CONTENDED``: the measurement is dominated by waiting for a core. None otherwise."""
    if wire_s <= 0:
        return None
    ratio = measured_comm_s / wire_s
    return ratio if ratio >= CONTENDED else None
