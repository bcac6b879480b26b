"""What a rank receives: the ``RankContext`` (a ``labkit.launch`` function) or the
``RunContext`` (a strategy: the same, with the run's config always set), and what a
strategy returns, the ``RankOutput``.

A context names this rank (``rank``, ``world_size``, its grid coordinates ``dp_rank`` /
``pp_rank`` / ``tp_rank``), hands it the traced ``Comm`` of the world and of each grid
axis, the tracer and the device, and marks steps (``ctx.step(s)``: the progress bar,
fault injection and the STEP span). ``labkit.rank.group`` builds it; nothing
here starts a process or opens a group.

Torch is imported lazily: the supervisor unpickles ``RankOutput`` without it.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from labkit.base.events import ABORTED, Event, Op
from labkit.base.grid import Coords, Grid

if TYPE_CHECKING:
    import torch

    from labkit.config.run import RunConfig
    from labkit.trace.comm import Comm
    from labkit.trace.tracer import Tracer


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
        self._start = ctx.tracer.clock()
        return self._step

    def __exit__(self, exc_type: object, *exc: object) -> None:
        ctx = self._ctx
        tr = ctx.tracer
        if exc_type is None:  # the step alone: the tracer's cheapest record
            tr.record(Op.STEP, self._start, tr.clock(), self._step)
        else:
            tr.record(Op.STEP, self._start, tr.clock(), self._step, name=ABORTED)
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
    """Handed to every function run with ``labkit.launch`` (and, as a ``RunContext``, to every
    strategy)."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device
    tracer: Tracer
    comm: Comm
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

    # ---- the rank grid -----------------------------------------------------------------
    @functools.cached_property
    def coords(self) -> Coords:
        """This rank's place on the grid (worked out once: every step's batch asks for it)."""
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

    @property
    def cp_rank(self) -> int:
        """This rank's place in its context-parallel group (0 without a grid)."""
        return self.coords.cp if self.grid is not None else 0

    @property
    def ep_rank(self) -> int:
        """This rank's place in its expert-parallel group (0 without a grid)."""
        return self.coords.ep if self.grid is not None else 0

    def comm_on(self, axis: str) -> Comm:
        """The traced ``Comm`` of ``axis`` ("dp", "pp", "cp", "tp" or "ep"): its ranks are
        the group's."""
        from labkit.base.grid import GROUP_AXES

        if axis not in GROUP_AXES:
            raise ValueError(f"axis {axis!r} must be one of {', '.join(GROUP_AXES)}")
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

    @property
    def cp_comm(self) -> Comm:
        """The context-parallel group (ring attention passes K/V blocks around it)."""
        return self.comm_on("cp")

    @property
    def ep_comm(self) -> Comm:
        """The expert-parallel group (over the data ranks; MoE all-to-alls)."""
        return self.comm_on("ep")

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
            from labkit.rank.subgroups import build_node_comms

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



@dataclass
class RunContext(RankContext):
    """What every rank of a ``labkit.run`` gets: a ``RankContext`` that also holds the run's
    config (always: a strategy reads its settings from it)."""

    config: RunConfig = field(kw_only=True)
    """The run's resolved config (``labkit.config.run``)."""

    @property
    def options(self) -> Any:
        """The strategy's options dataclass (``config.options``)."""
        return self.config.options

    @classmethod
    def of(cls, ctx: RankContext, config: RunConfig) -> RunContext:
        """``ctx`` (a ``labkit.launch`` function's rank context) with a run's ``config``: how a
        launched function runs a strategy's loop beside its own code (lesson 05's ZeRO)."""
        given = {f.name: getattr(ctx, f.name) for f in fields(RankContext) if f.init}
        return cls(**given, config=config)
