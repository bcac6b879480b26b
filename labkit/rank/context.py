"""What runs inside each rank: the bootstrap and the ``RankContext`` strategies receive.

A rank (1) limits its torch threads so N ranks share the cores, (2) seeds its RNGs,
(3) joins the process group through the store the supervisor (or torchrun) gave it, with a
timeout so a dead peer can never block it for 30 minutes, (4) waits at a barrier and sets
its clock origin so every rank's spans share one time axis, (5) runs the strategy or the
student's function, and (6) returns its events and results as plain data. Steps 2-6 live
in ``labkit.rank.group`` (``RankGroup``), shared with the warm ranks of ``labkit.Pool``,
which join the group once and run job after job.

This module imports torch lazily: the supervisor imports it to find the child entry point
and must not pay for torch.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from labkit.base.events import ABORTED, Event, Op
from labkit.base.grid import Coords, Grid

if TYPE_CHECKING:
    import torch

    from labkit.config.run import RunConfig
    from labkit.trace.comm import Comm
    from labkit.trace.tracer import Tracer


@dataclass
class Job:
    """Everything a rank needs, pickled (with cloudpickle) by the supervisor."""

    config: RunConfig | None = None
    fn: Any = None
    """A function run on every rank as ``fn(ctx, *args)`` (code exercises); else the strategy."""
    args: tuple[Any, ...] = ()
    backend: str = "gloo"
    threads: int = 1
    timeout_s: float = 60.0
    seed: int = 0
    trace: bool = True
    grid: Grid | None = None
    """How the ranks are laid out (dp x pp x tp); None: one flat group with no axis."""


@dataclass
class RankOutput:
    """What a strategy returns from one rank (plain Python / numpy values only)."""

    losses: list[float] = field(default_factory=list)
    """Loss per step as this rank computed it (empty on ranks that compute no loss)."""
    metrics: dict[str, Any] = field(default_factory=dict)
    params_sha256: str | None = None
    """Hash of the full final model parameters (set by one rank, usually rank 0)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Recorded data the visuals need (e.g. ring chunk values)."""
    record: Any = None
    """The strategy's typed metrics of this rank (a ``labkit.config.metrics.RankMetrics``); the
    runner combines every rank's record into the run's metrics."""

    def all_metrics(self) -> dict[str, Any]:
        """This rank's own view: the free-form metrics and its record's fields."""
        return {**self.metrics, **(self.record.as_dict() if self.record is not None else {})}


@dataclass
class RankReport:
    """What one rank sends back to the supervisor."""

    rank: int
    host: str
    events: list[Event]
    output: Any


class _StepSpan:
    __slots__ = ("_ctx", "_start", "_step")

    def __init__(self, ctx: RankContext, step: int):
        self._ctx, self._step, self._start = ctx, step, 0

    def __enter__(self) -> int:
        ctx = self._ctx
        if ctx.progress is not None:
            ctx.progress.value = self._step
        if ctx.fault is not None and ctx.fault.step == self._step and ctx.fault.rank == ctx.rank:
            inject_fault(ctx.fault.kind, self._step)
        self._start = ctx.tracer.now()
        return self._step

    def __exit__(self, exc_type: object, *exc: object) -> None:
        ctx = self._ctx
        ctx.tracer.record(Op.STEP, self._start, ctx.tracer.now(), step=self._step,
                          name=None if exc_type is None else ABORTED)
        if ctx.progress is not None:
            ctx.progress.value = self._step + 1
        if ctx.spool is not None:
            ctx.spool.write()


def inject_fault(kind: str, step: int) -> None:
    """Fail this rank on purpose (lessons and tests of the supervisor)."""
    import signal

    if kind == "raise":
        raise RuntimeError(f"injected fault: rank raised at step {step}")
    if kind == "exit":
        os._exit(3)
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "hang":
        while True:
            time.sleep(3600)


@dataclass
class RankContext:
    """Handed to every strategy and to every function run with ``labkit.launch``."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device
    tracer: Tracer
    comm: Comm
    config: RunConfig | None = None
    seed: int = 0
    progress: Any = None
    fault: Any = None
    spool: Any = None
    """Writes this rank's events to disk as it goes (``labkit.trace.spool``), so a failed run
    still has a timeline; None under torchrun and on CUDA."""
    grid: Grid | None = None
    """The rank grid (dp x pp x tp). None (``labkit.launch`` without a grid): one flat
    group, which every axis means (``pp_rank == rank``, ``pp_comm is comm``)."""
    axis_comms: dict[str, Comm] = field(default_factory=dict)
    """One traced ``Comm`` per grid axis (see ``comm_on``)."""
    ranks_per_node: int | None = None
    """Ranks on each node (torchrun's LOCAL_WORLD_SIZE); None: every rank on one node."""
    _node_comms: tuple[Comm, Comm] | None = field(default=None, repr=False)

    @property
    def options(self) -> Any:
        return self.config.options if self.config is not None else None

    # ---- the rank grid -----------------------------------------------------------------
    @property
    def coords(self) -> Coords:
        if self.grid is None:
            return Coords(self.rank, self.rank, self.rank)
        return self.grid.coords(self.rank)

    @property
    def dp_rank(self) -> int:
        return self.coords.dp

    @property
    def pp_rank(self) -> int:
        return self.coords.pp

    @property
    def tp_rank(self) -> int:
        return self.coords.tp

    def comm_on(self, axis: str) -> Comm:
        """The traced ``Comm`` of ``axis`` ("dp", "pp" or "tp"): its ranks are the group's."""
        from labkit.base.grid import AXES

        if axis not in AXES:
            raise ValueError(f"axis {axis!r} must be one of {', '.join(AXES)}")
        return self.axis_comms.get(axis, self.comm)

    @property
    def dp_comm(self) -> Comm:
        return self.comm_on("dp")

    @property
    def pp_comm(self) -> Comm:
        return self.comm_on("pp")

    @property
    def tp_comm(self) -> Comm:
        return self.comm_on("tp")

    # ---- nodes ---------------------------------------------------------------------------
    @property
    def node_size(self) -> int:
        """Ranks per node; ranks ``k*node_size .. (k+1)*node_size - 1`` share node k."""
        return self.ranks_per_node or self.world_size

    def node_comms(self) -> tuple[Comm, Comm]:
        """(intra, inter): a ``Comm`` over this rank's node (axis "intra") and one over the
        ranks with this rank's local index on every node (axis "inter"). Collective: every
        rank must call it, at the same point, the first time."""
        if self._node_comms is None:
            self._node_comms = build_node_comms(self.comm, self.node_size)
        return self._node_comms

    def step(self, step: int) -> _StepSpan:
        """``with ctx.step(s):`` marks a training step (progress, fault injection, STEP span)."""
        return _StepSpan(self, step)

    def span(self, op: Op, **meta: Any) -> Any:
        return self.tracer.span(op, **meta)

    def events(self) -> list[Event]:
        """This rank's events so far, with every finished async op's span recorded.

        Use this (not ``tracer.events()``) to compute metrics from the trace inside a rank:
        an async op's span is recorded by a callback that may run after training returns.
        """
        self.comm.drain()
        return self.tracer.events()


def _die_with_parent(parent_pid: int | None = None, signum: int | None = None) -> None:
    """Ask Linux to SIGKILL this rank (or send ``signum``) if the supervisor dies (no
    orphans, even on kill -9).

    The signal is armed only from this call on: a parent that died between our ``fork``
    and here left us re-parented already, which ``parent_pid`` (the supervisor's pid, when
    known) detects. A new session (``start_new_session``) does not disarm it.
    """
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL if signum is None else signum)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)  # the supervisor is gone already: nobody will read our result


def limit_threads(threads: int) -> None:
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)


def run_rank(job: Job, rank: int, world_size: int, *, local_rank: int | None = None,
             store: Any = None, status: Any = None, progress: Any = None,
             before_destroy: Any = None, spool_dir: str | None = None,
             ranks_per_node: int | None = None, existing_group: bool = False) -> RankReport:
    """Set up this rank, run the job, and return its report (the process group is destroyed).

    ``store`` None means env:// rendezvous (torchrun sets MASTER_ADDR / MASTER_PORT).
    ``spool_dir`` (the supervisor's run directory) turns on the event spool.
    ``before_destroy(report)`` runs while the group is still up (torchrun's worker gathers
    every rank's report to rank 0 there). ``ranks_per_node`` (torchrun's LOCAL_WORLD_SIZE)
    tells hierarchical collectives where the node boundaries are. ``existing_group``: the
    launcher already made the default process group through its own env:// rendezvous (Ray
    Train's ``TorchConfig``); the rank uses it and leaves its teardown to the launcher. A
    warm pool rank runs its jobs the same way (``labkit.rank.group``), keeping the group open
    between them.
    """
    limit_threads(job.threads)
    from labkit.rank.group import RankGroup

    group = (RankGroup.adopt(job.backend, rank, world_size, local_rank=local_rank)
             if existing_group else
             RankGroup.open(job.backend, rank, world_size, timeout_s=job.timeout_s + 30,
                            local_rank=local_rank, store=store))
    try:
        return group.run(job, status=status, progress=progress, before_destroy=before_destroy,
                         spool_dir=spool_dir, ranks_per_node=ranks_per_node)
    finally:
        if not existing_group:
            group.close()


def build_node_comms(world: Comm, node_size: int) -> tuple[Comm, Comm]:
    """The two groups of a hierarchical collective, ranks contiguous per node (torchrun's
    numbering): intra = this rank's node, inter = the same local index on every node.
    A group of one rank gets a ``Comm`` that records nothing (as for a grid axis of size 1)."""
    import torch.distributed as dist

    n = world.world_size
    if node_size < 1 or n % node_size:
        raise ValueError(f"ranks_per_node ({node_size}) must divide world_size ({n})")
    nodes = n // node_size
    intra_groups = [list(range(k * node_size, (k + 1) * node_size)) for k in range(nodes)]
    inter_groups = [list(range(i, n, node_size)) for i in range(node_size)]
    comms = []
    for axis, groups in (("intra", intra_groups), ("inter", inter_groups)):
        mine = next(g for g in groups if world.rank in g)
        if len(mine) == 1:
            comms.append(world.on(axis, "solo", mine))
        elif len(mine) == n:
            comms.append(world.on(axis, None, mine))
        else:
            group, _ = dist.new_subgroups_by_enumeration(groups)
            comms.append(world.on(axis, group, mine))
    return comms[0], comms[1]


def torchrun_store(rank: int, world_size: int, job: int = 0) -> Any:
    """The env:// store torchrun set up, namespaced by restart attempt (and job).

    After ``torchrun --max-restarts`` restarts a group, the store may still hold the keys the
    killed attempt wrote (its gloo addresses); new ranks that read them hang connecting to
    dead processes. A per-attempt prefix (TORCHELASTIC_RESTART_COUNT) keeps attempts apart;
    ``job`` does the same for several runs one after the other in the same processes.
    """
    import torch.distributed as dist

    store, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=world_size))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    prefix = f"labkit/attempt_{attempt}" + (f"/job_{job}" if job else "")
    return dist.PrefixStore(prefix, store)
