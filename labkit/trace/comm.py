"""The traced communication layer: the only module that calls ``torch.distributed`` ops.

Strategies never call ``torch.distributed`` directly; they call a ``Comm``. Every call
records one span on the rank's comm lane with the bytes it carried and the peer it talked
to, so the lessons can count bytes exactly and see when communication happened.

Byte convention (``Event.bytes``): for point-to-point ops, the bytes of the tensor sent or
received; for collectives, the *payload* (the size of the tensor the caller hands in for
all-reduce / broadcast / reduce / reduce-scatter input, the gathered output for
all-gather). What an algorithm actually puts on the wire for a collective depends on the
algorithm (a ring all-reduce sends ``2(n-1)/n`` of the payload); ``wire_bytes`` converts.

Async ops (``async_op=True``) return a ``Handle``: the span runs from launch to completion
(taken from the work's future where the backend offers one), and ``Handle.wait`` records the
time the caller spent blocked as a separate ``wait`` span — the *exposed* communication.

How a rank waits (``spin_waits``): by default it sleeps in the backend until the work is
done. ``LABKIT_COMM_WAIT=spin`` makes a gloo rank poll its collectives instead, yielding the
core between polls: a rank that sleeps lets its core go idle, and waking it costs a
scheduler round trip (on a virtual machine, a halted virtual CPU the host must run again).
Measured on 2 quiet virtual cores (``bench/bench_comm_wait.py``, docs/benchmarks.md): ten
all-reduces of a ddp-naive step took 15-17.3 ms at their median sleeping and 7.6-9.4 ms
polling in plain torch; labkit's 2-rank ddp-naive step 20-32 ms against 14-23 ms; the
lessons' verdicts did not yet hold more often with it, so it stays a choice, not the default.
Ranks that share cores never spin: a waiting rank would take a core from one that computes.
Only all-reduces are polled (gloo's other work reports completion only inside ``wait``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from labkit.base.cpuload import cpu_count
from labkit.base.events import Op
from labkit.base.validate import COMM_WAIT_ENV, comm_wait_problem
from labkit.trace.tracer import Tracer

_now = time.monotonic_ns

_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
               "product": dist.ReduceOp.PRODUCT}


def tensor_collective(name: str, module: Any = dist) -> Callable[..., Any]:
    """``torch.distributed``'s one-tensor collective ``name`` ("reduce_scatter" or
    "all_gather"), whichever spelling this torch has: torch 2.13 calls them
    ``reduce_scatter_single`` / ``all_gather_single``; the torch releases pyproject allows
    before that (2.4 on) only ``reduce_scatter_tensor`` / ``all_gather_into_tensor`` (same
    arguments). A GPU server's image often ships an older torch than the CPU pin."""
    spellings = {"reduce_scatter": ("reduce_scatter_single", "reduce_scatter_tensor"),
                 "all_gather": ("all_gather_single", "all_gather_into_tensor")}[name]
    for spelling in spellings:
        fn = getattr(module, spelling, None)
        if fn is not None:
            return fn  # type: ignore[no-any-return]
    raise RuntimeError(f"this torch ({getattr(torch, '__version__', '?')}) has none of "
                       f"torch.distributed.{' / '.join(spellings)}: labkit needs torch >= 2.4")


_REDUCE_SCATTER = tensor_collective("reduce_scatter")
_ALL_GATHER = tensor_collective("all_gather")


def wire_bytes(op: Op, payload: int, world_size: int) -> float:
    """Bytes one rank sends for a collective implemented as a ring (nccl-tests convention)."""
    if op in (Op.ALL_REDUCE, Op.REDUCE_SCATTER, Op.ALL_GATHER):
        # imported here, not at the top: see ``docs/developing.md``, "A rank that aborts at
        # its end" -- a module-level import of labkit.theory made PowerSGD ranks abort
        from labkit.theory.comm import BUSBW_FACTORS

        return BUSBW_FACTORS[op.value](world_size) * payload
    return float(payload)


def spin_waits(backend: str, world_size: int) -> bool:
    """Whether ranks poll their collectives instead of sleeping in them: only when asked
    (``LABKIT_COMM_WAIT=spin``), and then only gloo ranks that each have a usable core (a
    GPU's NCCL work is waited on by its stream, not a core)."""
    wanted = os.environ.get(COMM_WAIT_ENV, "sleep")
    problem = comm_wait_problem(wanted)  # labkit.run and launch checked it before the ranks
    if problem is not None:
        raise ValueError(problem)
    return wanted == "spin" and backend == "gloo" and world_size <= cpu_count()


POLLED = frozenset({Op.ALL_REDUCE})
"""The ops a spinning rank polls: gloo's all-reduce reports completion while it runs; its
point-to-point and reduce-scatter work complete only inside ``wait``."""


POLL_NS = 50_000_000
"""How long a rank polls before it sleeps in ``wait`` after all: a work that never reports
completion from outside ``wait`` (gloo's point-to-point and reduce-scatter work) costs at
most this, never a hang."""


def _await(work: Any, spin: bool) -> None:
    """``work.wait()``, polling first when ``spin`` (the module docstring): the poll ends
    when the work completes or fails, or after ``POLL_NS``; ``wait`` then returns or
    raises the work's error."""
    if spin:
        done, yield_, until = work.is_completed, os.sched_yield, _now() + POLL_NS
        while not done() and _now() < until:
            yield_()
    work.wait()


_NO_FUTURE: set[tuple[type, Op]] = set()


def _future_of(work: Any, op: Op) -> Any:
    """The work's future, or None where the backend has none (gloo send / recv).

    Asking costs a C++ exception each time, about 0.1 ms on a busy core, and a pipeline step
    sends dozens of messages, so the answer is remembered per (work type, op).
    """
    key = (type(work), op)
    if key in _NO_FUTURE:
        return None
    try:
        return work.get_future()
    except RuntimeError:
        _NO_FUTURE.add(key)
        return None


class Handle:
    """An in-flight async op. ``wait()`` blocks until it is done and records the blocked time."""

    def __init__(self, comm: Comm, work: Any, op: Op, start: int, meta: dict[str, Any],
                 then: Callable[[], object] | None = None):
        self._comm, self._work, self._op, self._start, self._meta = comm, work, op, start, meta
        self._then = then
        self._recorded = False
        self._lock = threading.Lock()  # the backend's callback thread and drain() may race
        self.done_ns: int | None = None
        comm._pending_add(1)
        comm._root._live.add(self)
        fut = _future_of(work, op)
        if fut is not None:
            fut.add_done_callback(self._on_done)

    def _on_done(self, _fut: Any) -> None:
        self.done_ns = _now()
        self._record(self.done_ns)

    def _record(self, end: int) -> None:
        with self._lock:
            if self._recorded:
                return
            self._recorded = True
        self._comm.tracer.record(self._op, self._start, end, **self._meta)
        self._comm._pending_add(-1)
        self._comm._root._live.discard(self)

    def _settle(self) -> None:
        """Wait for the op (no ``then``, no wait span) and make sure its span is recorded."""
        _await(self._work, self._polls())
        self._record(self.done_ns if self.done_ns is not None else _now())

    def _polls(self) -> bool:
        """Spin on this op: one of ``POLLED`` on a spinning rank."""
        return self._comm._root.spin and self._op in POLLED

    def future(self) -> Any:
        """The backend's future for this op (collectives only), for chaining with ``then``."""
        return self._work.get_future()

    def is_completed(self) -> bool:
        return bool(self._work.is_completed())

    def wait(self) -> None:
        comm = self._comm
        t0 = _now()
        with comm._blocking():
            _await(self._work, self._polls())
        t1 = _now()
        self._record(self.done_ns if self.done_ns is not None else t1)
        if t1 - t0 > 20_000:  # blocked for more than 20 us: show it as exposed comm
            comm.tracer.record(Op.WAIT, t0, t1, step=self._meta.get("step"),
                               bucket=self._meta.get("bucket"), axis=comm.axis)
        if self._then is not None:
            then, self._then = self._then, None
            then()


class Comm:
    """Traced wrappers over torch.distributed for one rank, on one process group.

    ``rank`` and ``world_size`` are this rank's place in ``group`` (the whole run when
    ``group`` is None). On a rank grid every axis has its own ``Comm``: ``axis`` ("dp",
    "pp", "tp") is recorded on every span it makes, and ``ranks`` lists the global ranks of
    the group, so point-to-point peers are given as group ranks (``send(t, dst=1)`` on the
    pipeline axis means "the next stage") and recorded as global ranks (the timeline's rows).

    ``status`` (optional) is a shared-memory slot the supervisor reads: 1 while this rank is
    blocked inside communication or has an async op in flight. When a run hangs, that tells
    the rank that stopped making progress (0: stuck elsewhere) from the ranks waiting for it
    (1: waiting on a peer). Every ``Comm`` of a rank shares the rank's slot and counters.
    """

    def __init__(self, tracer: Tracer, rank: int, world_size: int, group: Any = None,
                 status: Any = None, *, axis: str | None = None,
                 ranks: list[int] | None = None, parent: Comm | None = None):
        self.tracer = tracer
        self.rank = rank
        self.world_size = world_size
        self.group = group
        self.axis = axis
        self.ranks = list(ranks) if ranks is not None else list(range(world_size))
        self._status = status
        self._depth = 0  # nesting of blocking calls
        self._pending = 0  # async ops launched and not yet complete
        self._live: set[Handle] = set()  # handles whose span is not recorded yet
        self.slow_link_Bps: float | None = None  # see emulate_slow_link
        self._root: Comm = parent._root if parent is not None else self
        self.spin = False
        """Whether this rank polls its waits (``spin_waits``; set on the rank's root Comm)."""

    def on(self, axis: str, group: Any, ranks: list[int]) -> Comm:
        """A ``Comm`` for one grid axis: ``group``'s collectives, ``ranks`` its members
        (global ranks, index = rank within the group). Shares this rank's hang status."""
        return Comm(self.tracer, ranks.index(self.global_rank), len(ranks), group,
                    self._status, axis=axis, ranks=ranks, parent=self)

    @property
    def global_rank(self) -> int:
        return self.ranks[self.rank]

    # --- hang bookkeeping -------------------------------------------------------------
    def _blocking(self) -> _Blocking:
        return _Blocking(self)

    def _update_status(self) -> None:
        root = self._root
        if root._status is not None:
            root._status.value = 1 if (root._depth > 0 or root._pending > 0) else 0

    def _pending_add(self, delta: int) -> None:
        self._root._pending += delta
        self._update_status()

    def drain(self) -> None:
        """Record every async op still in flight (called before a rank hands in its events).

        An op's span is normally recorded by a callback on its future, but a continuation
        chained with ``then`` (DDP's comm hooks, PowerSGD) may let training finish before that
        callback has run; without draining, the last step could miss its final all-reduce.
        """
        for handle in list(self._root._live):
            handle._settle()

    # --- core -------------------------------------------------------------------------
    def _run(self, op: Op, fn: Callable[..., Any], args: tuple[Any, ...], async_op: bool,
             meta: dict[str, Any], then: Callable[[], object] | None = None) -> Any:
        """``fn(*args, group=...)`` traced as one ``op`` span; a spinning rank launches an op
        of ``POLLED`` async and polls it (``_await``)."""
        if self.group is SOLO:
            return _solo(op, args, async_op, then)
        if self.axis is not None:
            meta.setdefault("axis", self.axis)
        start = _now()
        if async_op:
            work = fn(*args, group=self.group, async_op=True)
            return Handle(self, work, op, start, meta, then)
        with self._blocking():
            if op in POLLED and self._root.spin:
                _await(fn(*args, group=self.group, async_op=True), True)
            else:
                fn(*args, group=self.group)
        self.tracer.record(op, start, _now(), **meta)
        if then is not None:
            then()
        return None

    # --- collectives --------------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", *, async_op: bool = False,
                   **meta: Any) -> Handle | None:
        """Reduce ``tensor`` across ranks in place (``op``: sum, max, min, product, avg)."""
        avg = op == "avg"
        red = _REDUCE_OPS["sum" if avg else op]
        then = (lambda: tensor.div_(self.world_size)) if avg else None
        meta.setdefault("bytes", _nbytes(tensor))
        return self._run(Op.ALL_REDUCE, lambda t, **kw: dist.all_reduce(t, op=red, **kw),
                         (tensor,), async_op, meta, then)

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: str = "sum", *,
                       async_op: bool = False, **meta: Any) -> Handle | None:
        """Sum ``input`` (world_size equal chunks) across ranks; chunk ``rank`` lands in ``output``."""
        avg = op == "avg"
        red = _REDUCE_OPS["sum" if avg else op]
        then = (lambda: output.div_(self.world_size)) if avg else None
        meta.setdefault("bytes", _nbytes(input))
        return self._run(Op.REDUCE_SCATTER,
                         lambda o, i, **kw: _REDUCE_SCATTER(o, i, op=red, **kw),
                         (output, input), async_op, meta, then)

    def all_gather(self, output: torch.Tensor, input: torch.Tensor, *, async_op: bool = False,
                   **meta: Any) -> Handle | None:
        """Concatenate every rank's ``input`` into ``output`` (world_size x input)."""
        meta.setdefault("bytes", _nbytes(output))
        return self._run(Op.ALL_GATHER, _ALL_GATHER, (output, input), async_op, meta)

    def broadcast(self, tensor: torch.Tensor, src: int, *, async_op: bool = False,
                  **meta: Any) -> Handle | None:
        """Copy ``tensor`` from group rank ``src`` to every rank of the group."""
        g = self.ranks[src]
        meta.setdefault("bytes", _nbytes(tensor))
        meta.setdefault("peer", g)
        return self._run(Op.BROADCAST, lambda t, **kw: dist.broadcast(t, g, **kw), (tensor,),
                         async_op, meta)

    def broadcast_object(self, obj: Any, src: int = 0, **meta: Any) -> Any:
        """Group rank ``src``'s picklable ``obj`` on every rank of the group (returned); for
        small decisions one rank makes for all (e.g. which checkpoint to resume from)."""
        box = [obj]
        g = self.ranks[src]
        meta.setdefault("peer", g)
        self._run(Op.BROADCAST, lambda b, **kw: dist.broadcast_object_list(b, src=g, **kw),
                  (box,), False, meta)
        return box[0]

    def gather_object(self, obj: Any, dst: int = 0, **meta: Any) -> list[Any] | None:
        """Every group rank's picklable ``obj``, in group-rank order, on group rank ``dst``
        (None on the others); e.g. a pipeline's stages putting the whole model together."""
        if self.group is SOLO:
            return [obj]
        out: list[Any] | None = [None] * self.world_size if self.rank == dst else None
        g = self.ranks[dst]
        meta.setdefault("peer", g)
        self._run(Op.GATHER, lambda o, **kw: dist.gather_object(o, out, dst=g, **kw), (obj,),
                  False, meta)
        return out

    def reduce(self, tensor: torch.Tensor, dst: int, op: str = "sum", *, async_op: bool = False,
               **meta: Any) -> Handle | None:
        """Reduce ``tensor`` across the group onto group rank ``dst``."""
        red = _REDUCE_OPS[op]
        g = self.ranks[dst]
        meta.setdefault("bytes", _nbytes(tensor))
        meta.setdefault("peer", g)
        return self._run(Op.REDUCE, lambda t, **kw: dist.reduce(t, g, op=red, **kw), (tensor,),
                         async_op, meta)

    def all_to_all(self, output: torch.Tensor, input: torch.Tensor, *, async_op: bool = False,
                   output_split_sizes: list[int] | None = None,
                   input_split_sizes: list[int] | None = None, **meta: Any) -> Handle | None:
        """Send chunk r of ``input`` (along dim 0) to group rank r and receive chunk r of
        ``output`` from it: equal chunks, or ``input_split_sizes[r]`` rows to rank r and
        ``output_split_sizes[r]`` rows from it (each pair of ranks must agree). Bytes: the
        whole ``input``, the chunk a rank keeps for itself included."""
        meta.setdefault("bytes", _nbytes(input))
        return self._run(Op.ALL_TO_ALL,
                         lambda o, i, **kw: dist.all_to_all_single(
                             o, i, output_split_sizes, input_split_sizes, **kw),
                         (output, input), async_op, meta)

    def barrier(self, **meta: Any) -> None:
        self._run(Op.BARRIER, lambda **kw: dist.barrier(**kw), (), False, meta)

    # --- point to point (peers are group ranks; spans record the global rank) ------------
    def _p2p_meta(self, tensor: torch.Tensor, peer: int, meta: dict[str, Any]) -> dict[str, Any]:
        meta.setdefault("bytes", _nbytes(tensor))
        if self.axis is not None:
            meta.setdefault("axis", self.axis)
        return {**meta, "peer": self.ranks[peer]}

    def emulate_slow_link(self, bandwidth_Bps: float | None) -> None:
        """Make every send of THIS rank also wait ``bytes / bandwidth_Bps`` inside its span.

        A rank that sleeps in communication: what a slow outgoing link looks like on the
        timeline (problem set 4's recorded traces use it). ``None`` switches it off.
        """
        self.slow_link_Bps = bandwidth_Bps

    def _link_delay(self, tensor: torch.Tensor) -> None:
        if self.slow_link_Bps:
            time.sleep(_nbytes(tensor) / self.slow_link_Bps)

    def send(self, tensor: torch.Tensor, dst: int, *, tag: int = 0, **meta: Any) -> None:
        g = self.ranks[dst]

        def slow_send(t: torch.Tensor, **kw: Any) -> None:
            self._link_delay(t)
            dist.send(t, g, tag=tag, **kw)

        self._run(Op.SEND, slow_send, (tensor,), False, self._p2p_meta(tensor, dst, meta))

    def recv(self, tensor: torch.Tensor, src: int, *, tag: int = 0, **meta: Any) -> None:
        g = self.ranks[src]
        self._run(Op.RECV, lambda t, **kw: dist.recv(t, g, tag=tag, **kw), (tensor,), False,
                  self._p2p_meta(tensor, src, meta))

    def recv_any(self, tensor: torch.Tensor, *, tag: int = 0, **meta: Any) -> int:
        """Receive the next message with ``tag`` from whichever rank sends first; returns the
        sender's group rank. The span names it as ``peer`` and lasts from the call to the
        arrival, so a server's idle wait for requests is visible.

        gloo only (NCCL cannot receive from an unnamed source). A parameter server uses it
        to serve workers in the order their requests arrive.
        """
        meta.setdefault("bytes", _nbytes(tensor))
        if self.axis is not None:
            meta.setdefault("axis", self.axis)
        start = _now()
        with self._blocking():
            src = dist.recv(tensor, group=self.group, tag=tag)
        self.tracer.record(Op.RECV, start, _now(), peer=src, **meta)
        return self.ranks.index(src)

    def isend(self, tensor: torch.Tensor, dst: int, *, tag: int = 0, **meta: Any) -> Handle:
        meta = self._p2p_meta(tensor, dst, meta)
        start = _now()
        self._link_delay(tensor)
        work = dist.isend(tensor, self.ranks[dst], group=self.group, tag=tag)
        return Handle(self, work, Op.SEND, start, meta)

    def irecv(self, tensor: torch.Tensor, src: int, *, tag: int = 0, **meta: Any) -> Handle:
        meta = self._p2p_meta(tensor, src, meta)
        start = _now()
        work = dist.irecv(tensor, self.ranks[src], group=self.group, tag=tag)
        return Handle(self, work, Op.RECV, start, meta)

    # --- escape hatch for torch's own wrappers (DDP comm hooks, FSDP) ------------------
    def traced(self, op: Op, **meta: Any) -> Any:
        """A span for communication issued by torch itself (e.g. inside FSDP)."""
        return self.tracer.span(op, **meta)


SOLO = "solo"
"""The ``group`` of a ``Comm`` over one rank (a grid axis of size 1): no process group."""


class _Done:
    """The handle of an op on a one-rank group: already complete."""

    def __init__(self, tensor: torch.Tensor | None):
        self._tensor = tensor

    def wait(self) -> None:
        return None

    def is_completed(self) -> bool:
        return True

    def future(self) -> Any:
        fut: Any = torch.futures.Future()
        fut.set_result([self._tensor])
        return fut


def _solo(op: Op, args: tuple[Any, ...], async_op: bool,
          then: Callable[[], object] | None) -> _Done | None:
    """A collective on a group of one rank: the result is the input; nothing is recorded
    (no byte leaves the rank)."""
    if op in (Op.REDUCE_SCATTER, Op.ALL_GATHER, Op.ALL_TO_ALL):
        out, inp = args
        if out.data_ptr() != inp.data_ptr():
            out.copy_(inp.reshape(out.shape))
    elif op in (Op.SEND, Op.RECV):
        raise ValueError("point-to-point on a one-rank group has no peer")
    if then is not None:
        then()
    return _Done(args[0] if args else None) if async_op else None


class _Blocking:
    __slots__ = ("_comm",)

    def __init__(self, comm: Comm):
        self._comm = comm

    def __enter__(self) -> None:
        c = self._comm
        c._root._depth += 1
        c._update_status()
        c.tracer.pause_compute()  # blocked here: not computing

    def __exit__(self, *exc: object) -> None:
        c = self._comm
        c._root._depth -= 1
        c._update_status()
        c.tracer.resume_compute()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
