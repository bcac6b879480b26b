"""This machine's communication, measured: what one collective costs in wall time and in CPU.

Teaches that on a machine whose ranks share cores a collective has two prices. Its wall time
is Hockney's ``alpha + bytes / bandwidth`` (the planner's wire), but fitted at the rank count
of the run it serves: 8 ranks on 2 cores wait for their partners to get a core, so the same
32 KB all-reduce takes several times longer than with 2. And its CPU seconds -- gloo's
copies, the reduction, the traced call's bookkeeping -- are taken from the other ranks that
share the cores, which a wall-time model alone never charges. ``labkit.lessons.plan_local.
time_comms`` times an all-reduce, a reduce-scatter, an all-gather and an isend / irecv exchange between pairs
of ranks, every pair at once, at a few sizes and at 2, 4 and 8 ranks; ``fit_comm`` fits each
op and rank count to two straight lines, one for wall and one for CPU (issue 38, item 4).
Pure Python, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from labkit.base.errors import ConfigError

COMM_OPS = ("all_reduce", "reduce_scatter", "all_gather", "exchange")
"""What ``labkit.lessons.plan_local.time_comms`` times: an all-reduce, a reduce-scatter and an
all-gather (a ring moves the same bytes in the two, yet gloo's reduce-scatter of ZeRO's units
took about twice the all-gather's time a call here), and an exchange (one isend and one irecv
a rank)."""


@dataclass(frozen=True, kw_only=True)
class CommCost:
    """One op at one rank count on this machine, fitted over message sizes:
    ``wall = wall_s + bytes x wall_s_per_byte``, ``CPU = cpu_s + bytes x cpu_s_per_byte``."""

    op: str
    """One of ``COMM_OPS``."""
    ranks: int
    """Ranks of the run it was measured in (in pairs, every pair at once)."""
    wall_s: float
    """Seconds a call takes whatever its size (latency, and waiting for a core)."""
    wall_s_per_byte: float
    """Seconds more per byte of the message (bytes as the trace counts them)."""
    cpu_s: float
    """CPU seconds a call costs its rank whatever its size."""
    cpu_s_per_byte: float
    """CPU seconds more per byte."""

    def wall(self, nbytes: float, calls: float = 1.0) -> float:
        return calls * self.wall_s + nbytes * self.wall_s_per_byte

    def cpu(self, nbytes: float, calls: float = 1.0) -> float:
        return calls * self.cpu_s + nbytes * self.cpu_s_per_byte


def _line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b x``, neither below 0 (a slope noise made negative: the mean)."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    if b < 0:
        return max(0.0, my), 0.0
    a = my - b * mx
    if a < 0:  # through the origin instead
        return 0.0, sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)
    return a, b


def fit_comm(op: str, ranks: int, rows: Sequence[tuple[float, float, float]]) -> CommCost:
    """``CommCost`` of ``op`` at ``ranks`` from ``(bytes, wall s, CPU s)`` rows of two or more
    sizes: a straight line each (``alpha + bytes / bandwidth``, Hockney's model)."""
    if op not in COMM_OPS:
        raise ConfigError(f"op ({op!r}) must be one of {COMM_OPS}; e.g. op='all_reduce'")
    if len({r[0] for r in rows}) < 2 or any(r[0] <= 0 or r[1] < 0 or r[2] < 0 for r in rows):
        raise ConfigError(f"fit_comm needs two or more sizes > 0 with times >= 0 (got "
                          f"{list(rows)}); e.g. rows=[(4096, 2e-4, 1e-4), (262144, 9e-4, 4e-4)]")
    sizes = [float(r[0]) for r in rows]
    wall, wall_b = _line(sizes, [r[1] for r in rows])
    cpu, cpu_b = _line(sizes, [r[2] for r in rows])
    return CommCost(op=op, ranks=ranks, wall_s=wall, wall_s_per_byte=wall_b, cpu_s=cpu,
                    cpu_s_per_byte=cpu_b)


def wire_of(fit: CommCost) -> tuple[float, float]:
    """The alpha-beta of a pair's all-reduce fit: a 2-member ring takes ``2 alpha + S / B``
    (``ring_allreduce_time``), so ``alpha = wall_s / 2`` and ``B = 1 / wall_s_per_byte``."""
    return fit.wall_s / 2, 1.0 / fit.wall_s_per_byte if fit.wall_s_per_byte > 0 else 1e15
