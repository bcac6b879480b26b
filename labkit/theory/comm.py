"""Communication cost on paper: ring all-reduce, bus bandwidth, and what it does to speedup.

Teaches: a ring all-reduce makes each of n ranks send ``2(n-1)/n`` times the tensor,
almost independent of n, while a naive "reduce to rank 0, then broadcast" piles
``(n-1)`` tensors onto the root. Time follows the alpha-beta model (Hockney 1994; Thakur,
Rabenseifner and Gropp 2005): each message costs a latency alpha plus bytes / bandwidth.
Bandwidths are reported the nccl-tests way (``doc/PERFORMANCE.md`` in NVIDIA/nccl-tests):
algorithm bandwidth = size / time, bus bandwidth = algbw x a per-collective factor so that
it can be compared to the link's peak. And the speedup side: Amdahl's law, scaling
efficiency, and why 8 data-parallel GPUs may give only 6x (seed 003).
Units: bytes, seconds, bytes per second (Bps) throughout.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from labkit.base.errors import ConfigError
from labkit.theory.batch import check_choice, check_int, check_number

NAIVE_SCHEMES = ("reduce_broadcast", "all_to_all")
# nccl-tests bus-bandwidth factors, as functions of the world size n.
BUSBW_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}


def ring_allreduce_steps(world_size: int) -> int:
    """Messages each rank sends, one after another, in a ring all-reduce: ``2(n-1)``
    (reduce-scatter's n-1 steps, then all-gather's n-1), each a 1/n chunk of the tensor.
    Each costs one latency alpha in the alpha-beta model; one rank sends none."""
    n = check_int("world_size", world_size, 1, "world_size=4")
    return 2 * (n - 1)


def ring_allreduce_bytes(size_bytes: float, world_size: int) -> float:
    """Bytes each rank SENDS in a ring all-reduce of a ``size_bytes`` tensor.

    Reduce-scatter then all-gather, each n-1 steps of a 1/n chunk: ``2(n-1)/n * size``.
    One rank sends nothing; a large ring tends to 2x the tensor per rank.
    """
    size = check_number("size_bytes", size_bytes, "size_bytes=4e6")
    n = check_int("world_size", world_size, 1, "world_size=4")
    return BUSBW_FACTORS["all_reduce"](n) * size


def hierarchical_allreduce_bytes(size_bytes: float, gpus_per_node: int, nodes: int
                                 ) -> dict[str, float]:
    """Bytes each GPU sends in a two-level all-reduce, inside its node and between nodes.

    1. reduce-scatter inside each node (g GPUs): every GPU ends with the node's sum of
       1/g of the tensor; 2. a ring all-reduce between nodes, each GPU on its own 1/g
       shard with its peers of the same local rank; 3. all-gather inside the node. So only
       ``2(N-1)/N x size/g`` crosses the slow inter-node link per GPU, where a flat ring
       over all N x g GPUs makes its node-crossing links carry ``2(Ng-1)/(Ng) x size``.
    Keys: ``intra`` and ``inter`` (per GPU), ``flat_ring`` (per GPU, for comparison).
    """
    size = check_number("size_bytes", size_bytes, "size_bytes=4e9")
    g = check_int("gpus_per_node", gpus_per_node, 1, "gpus_per_node=8")
    n = check_int("nodes", nodes, 1, "nodes=4")
    return {"intra": ring_allreduce_bytes(size, g), "inter": ring_allreduce_bytes(size / g, n),
            "flat_ring": ring_allreduce_bytes(size, n * g)}


def naive_allreduce_bytes(size_bytes: float, world_size: int,
                          scheme: str = "reduce_broadcast") -> dict[str, float]:
    """Bytes sent by the root and by any other rank in a naive all-reduce.

    ``"reduce_broadcast"``: every non-root sends its tensor to rank 0 (``size``), rank 0
    sums and sends the result back to each (``(n-1)*size``): the root is the bottleneck.
    ``"all_to_all"``: every rank sends its whole tensor to every other rank and sums
    locally, ``(n-1)*size`` each. Keys: ``root``, ``non_root`` and ``total`` (all ranks).
    """
    size = check_number("size_bytes", size_bytes, "size_bytes=4e6")
    n = check_int("world_size", world_size, 1, "world_size=4")
    check_choice("scheme", scheme, NAIVE_SCHEMES, "scheme='reduce_broadcast'")
    if scheme == "reduce_broadcast":
        root = (n - 1) * size
        non_root = size if n > 1 else 0.0
    else:
        root = non_root = (n - 1) * size
    return {"root": root, "non_root": non_root, "total": root + (n - 1) * non_root}


def alpha_beta_time(messages: float, bytes_sent: float, alpha_s: float,
                    bandwidth_Bps: float) -> float:
    """The alpha-beta model itself: ``messages`` sent one after another cost a latency
    ``alpha_s`` each, and ``bytes_sent`` in all cost ``bytes_sent / bandwidth_Bps``. Every
    time this package predicts for a link is this sum (no checks here: the callers' inputs
    are checked where a user gives them)."""
    return messages * alpha_s + bytes_sent / bandwidth_Bps


def ring_allreduce_time(size_bytes: float, world_size: int, alpha_s: float,
                        bandwidth_Bps: float) -> float:
    """Alpha-beta time of a ring all-reduce: ``2(n-1)*alpha + 2(n-1)/n * size / bandwidth``.

    ``alpha_s`` is the per-message latency (s); ``bandwidth_Bps`` the per-direction link
    bandwidth (bytes/s). The ring takes 2(n-1) sequential steps, each one message.
    """
    alpha = check_number("alpha_s", alpha_s, "alpha_s=5e-6")
    bandwidth = check_number("bandwidth_Bps", bandwidth_Bps, "bandwidth_Bps=25e9",
                             allow_equal=False)
    n = check_int("world_size", world_size, 1, "world_size=4")
    return alpha_beta_time(ring_allreduce_steps(n), ring_allreduce_bytes(size_bytes, n), alpha,
                           bandwidth)


def algbw(size_bytes: float, time_s: float) -> float:
    """Algorithm bandwidth in bytes/s: ``size_bytes / time_s`` (nccl-tests ``algbw``)."""
    size = check_number("size_bytes", size_bytes, "size_bytes=4e6")
    time = check_number("time_s", time_s, "time_s=0.001", allow_equal=False)
    return size / time


def busbw(algbw_Bps: float, world_size: int, collective: str = "all_reduce") -> float:
    """Bus bandwidth (bytes/s) from algorithm bandwidth, per nccl-tests.

    Factors for n ranks: all_reduce ``2(n-1)/n``; all_gather, reduce_scatter and
    all_to_all ``(n-1)/n`` (there ``size`` is the total gathered size, n x one rank's part);
    broadcast, reduce and send_recv 1. Bus bandwidth is what each link actually carried,
    so it is comparable with the hardware's peak whatever n is.
    """
    bandwidth = check_number("algbw_Bps", algbw_Bps, "algbw_Bps=10e9")
    n = check_int("world_size", world_size, 1, "world_size=4")
    check_choice("collective", collective, tuple(BUSBW_FACTORS), "collective='all_reduce'")
    return bandwidth * BUSBW_FACTORS[collective](n)


@dataclass
class AlphaBeta:
    """A fitted (or assumed) alpha-beta model of one link, used for ring all-reduce."""

    alpha_s: float  # latency per message, seconds
    bandwidth_Bps: float  # per-direction bandwidth, bytes per second
    world_size: int = 2  # ranks in the ring the fit came from
    r_squared: float | None = None  # goodness of fit, when fitted
    stall_s: float = 0.0
    """What one call took on average beyond the line, seconds: the benchmark's mean call
    minus the line fitted to its median calls (``labkit.strategies.collectives.bench``).
    The line is the wire; a sum of many calls also pays the calls that stalled (a waiting
    thread woken late), which the median leaves out. 0 for an assumed link."""

    @classmethod
    def from_bench(cls, fit: Mapping[str, Any], *, stalls: bool = True) -> AlphaBeta:
        """The link an ``allreduce-bench`` run fitted: its ``alpha_beta`` (or
        ``alpha_beta_fastest``) metrics. ``stalls=False`` leaves ``stall_s`` at 0: the line
        alone, the wire a replay on dedicated cores charges."""
        return cls(alpha_s=fit["alpha_s"], bandwidth_Bps=fit["bandwidth_gbps"] * 1e9,
                   world_size=fit.get("world_size", 2), r_squared=fit.get("r_squared"),
                   stall_s=fit.get("stall_s", 0.0) if stalls else 0.0)

    def predict(self, size_bytes: float, world_size: int | None = None) -> float:
        """Predicted ring all-reduce time (s) of ``size_bytes`` on ``world_size`` ranks."""
        n = self.world_size if world_size is None else world_size
        return ring_allreduce_time(size_bytes, n, self.alpha_s, self.bandwidth_Bps)

    def predict_mean(self, size_bytes: float, world_size: int | None = None) -> float:
        """The mean call's time (s): the line plus ``stall_s``, what each of many calls
        costs on average (a step of k all-reduces pays k of these)."""
        return self.predict(size_bytes, world_size) + self.stall_s


def fit_alpha_beta(sizes_bytes: Sequence[float], times_s: Sequence[float],
                   world_size: int) -> AlphaBeta:
    """Fit measured all-reduce times to the ring alpha-beta model, minimising *relative* error.

    Model: ``t = 2(n-1)*alpha + x / bandwidth`` with ``x = 2(n-1)/n * size``, a straight
    line in x. Measured sizes usually span several decades; an ordinary least-squares fit
    in seconds is then dominated by the largest messages and misses small ones by several
    times. Weighting each point by ``1/t**2`` minimises the squared relative error, so the
    fit is equally good (in %) at every size — what "predicted within 20%" asks for.
    Needs at least two distinct sizes and ``world_size >= 2``. A negative intercept (noise
    on tiny messages) is clamped to alpha = 0 and the bandwidth refit through the origin;
    times that do not grow with size raise ConfigError.
    """
    n = check_int("world_size", world_size, 2, "world_size=4")
    if len(sizes_bytes) != len(times_s):
        raise ConfigError(
            f"sizes_bytes ({len(sizes_bytes)} values) and times_s ({len(times_s)} values) "
            "must have the same length; e.g. sizes_bytes=[1e6, 1e7], times_s=[0.001, 0.008]")
    sizes = [check_number("sizes_bytes[]", s, "sizes_bytes=[1e6, 1e7]") for s in sizes_bytes]
    times = [check_number("times_s[]", t, "times_s=[0.001, 0.008]") for t in times_s]
    if len(set(sizes)) < 2:
        raise ConfigError(
            f"sizes_bytes ({list(sizes_bytes)!r}) must hold at least 2 distinct sizes to fit "
            "a line; e.g. sizes_bytes=[1e5, 1e6, 1e7]")
    xs = [ring_allreduce_bytes(s, n) for s in sizes]
    if any(t <= 0 for t in times):
        raise ConfigError(f"times_s ({list(times_s)!r}) must all be > 0 seconds")
    ws = [1.0 / (t * t) for t in times]  # relative-error weights
    wsum = sum(ws)
    mean_x = sum(w * x for w, x in zip(ws, xs)) / wsum
    mean_t = sum(w * t for w, t in zip(ws, times)) / wsum
    sxx = sum(w * (x - mean_x) ** 2 for w, x in zip(ws, xs))
    slope = sum(w * (x - mean_x) * (t - mean_t) for w, x, t in zip(ws, xs, times)) / sxx
    intercept = mean_t - slope * mean_x
    if intercept < 0:
        # 1. clamp the latency, 2. refit the slope through the origin (same weights)
        intercept = 0.0
        slope = (sum(w * x * t for w, x, t in zip(ws, xs, times))
                 / sum(w * x * x for w, x in zip(ws, xs)))
    mean_t = sum(times) / len(times)
    if slope <= 0:
        raise ConfigError(
            f"times_s ({list(times_s)!r}) do not grow with sizes_bytes, so no bandwidth "
            "can be fitted; measure larger messages, e.g. sizes from 1e5 to 1e8 bytes")
    predicted = [intercept + slope * x for x in xs]
    ss_res = sum((t - p) ** 2 for t, p in zip(times, predicted))
    ss_tot = sum((t - mean_t) ** 2 for t in times)
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return AlphaBeta(alpha_s=intercept / ring_allreduce_steps(n), bandwidth_Bps=1.0 / slope,
                     world_size=n, r_squared=r2)


def amdahl_speedup(parallel_fraction: float, n: int) -> float:
    """Amdahl's law: ``1 / ((1 - f) + f / n)`` for parallel fraction f on n workers."""
    f = check_number("parallel_fraction", parallel_fraction, "parallel_fraction=0.95")
    if f > 1:
        raise ConfigError(
            f"parallel_fraction ({parallel_fraction!r}) must be between 0 and 1; "
            "e.g. parallel_fraction=0.95")
    workers = check_int("n", n, 1, "n=8")
    return 1.0 / ((1.0 - f) + f / workers)


def fit_amdahl(step_times: dict[int, float]) -> float:
    """Amdahl's parallel fraction f fitted to measured step times of the SAME job (same
    global batch) on n workers: ``t_n / t_1 = (1 - f) + f / n``, least squares in f over
    every n > 1. ``step_times`` maps n -> seconds and must hold n = 1."""
    if 1 not in step_times or len(step_times) < 2:
        raise ConfigError(f"step_times ({step_times!r}) must hold the 1-worker time and at "
                          f"least one more; e.g. {{1: 0.30, 2: 0.18}}")
    t1 = check_number("step_times[1]", step_times[1], "0.30", allow_equal=False)
    # t_n/t_1 - 1 = f (1/n - 1): a line through the origin in x = 1/n - 1
    xs = [1.0 / n - 1.0 for n in step_times if n > 1]
    ys = [step_times[n] / t1 - 1.0 for n in step_times if n > 1]
    f = sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    return min(1.0, max(0.0, f))


def amdahl_fraction_for(speedup: float, n: int) -> float:
    """The parallel fraction that gives ``speedup`` on ``n`` workers (seed 003: 8 GPUs that
    give 6x need f = 0.952; the mini challenge, 2x on 4 GPUs, f >= 0.667)."""
    s = check_number("speedup", speedup, "speedup=6", allow_equal=False)
    workers = check_int("n", n, 2, "n=8")
    if s > workers:
        raise ConfigError(f"speedup ({speedup}) cannot exceed n ({n}) under Amdahl's law")
    return (1.0 - 1.0 / s) / (1.0 - 1.0 / workers)


def scaling_efficiency(step_time_1: float, step_time_n: float, n: int,
                       weak: bool = True) -> float:
    """Scaling efficiency from step times (s) on 1 and on n ranks.

    Weak scaling (same per-rank batch, n x the work per step): ``t1 / tn``.
    Strong scaling (same global batch split n ways): ``t1 / (n * tn)``.
    1.0 is perfect; 0.75 means a quarter of the added hardware is lost.
    """
    t1 = check_number("step_time_1", step_time_1, "step_time_1=0.30", allow_equal=False)
    tn = check_number("step_time_n", step_time_n, "step_time_n=0.40", allow_equal=False)
    workers = check_int("n", n, 1, "n=8")
    return t1 / tn if weak else t1 / (workers * tn)


def dp_speedup(compute_s: float, comm_s: float, n: int, overlap: float = 0.0) -> float:
    """Throughput speedup of n data-parallel ranks over one (weak scaling).

    Each rank computes for ``compute_s`` per step, then waits for the part of the
    gradient all-reduce (``comm_s``) not hidden behind backward: ``(1 - overlap) * comm_s``,
    ``overlap`` in [0, 1]. Speedup ``n * compute / (compute + exposed_comm)``; one rank
    needs no all-reduce. Seed 003's "8 GPUs give 6x" with labkit's own numbers (no seed
    gives them): compute 0.3 s, all-reduce 0.1 s, no overlap -> 8 * 0.3 / 0.4 = 6.0;
    bucketed overlap and bf16 gradients close the gap.
    """
    compute = check_number("compute_s", compute_s, "compute_s=0.3", allow_equal=False)
    comm = check_number("comm_s", comm_s, "comm_s=0.1")
    workers = check_int("n", n, 1, "n=8")
    hidden = check_number("overlap", overlap, "overlap=0.5")
    if hidden > 1:
        raise ConfigError(f"overlap ({overlap!r}) must be between 0 and 1; e.g. overlap=0.5")
    if workers == 1:
        return 1.0
    return workers * compute / (compute + (1.0 - hidden) * comm)
