"""Per-rank span recorder: cheap enough to leave on.

Each rank appends plain tuples to a list (a monotonic-ns clock read and one ``list.append``
per span edge, no I/O, no locks held across work). ``events()`` turns them into
``labkit.base.events.Event`` objects after the run. Times are taken from ``time.monotonic_ns``,
which on Linux is one system-wide clock, so ranks on one host share it; ``origin_ns`` (set
right after a barrier) makes every rank's zero the same instant.

On CUDA, spans of GPU work are timed with CUDA events instead (``CudaClock``): recording an
event does not synchronise; the events are resolved once, after the step loop.
"""

from __future__ import annotations

import time
from typing import Any

from labkit.base.events import RAW_FIELDS, Event, Lane, Op

_now = time.monotonic_ns
_cpu = time.thread_time_ns  # this thread's CPU clock: advances only while it runs on a core


class _Span:
    """Context manager for one span; created by ``Tracer.span``."""

    __slots__ = ("_meta", "_op", "_start", "_tracer")

    def __init__(self, tracer: Tracer, op: Op, meta: tuple[Any, ...]):
        self._tracer = tracer
        self._op = op
        self._meta = meta

    def __enter__(self) -> _Span:
        self._start = self._tracer.clock()
        return self

    def __exit__(self, *exc: object) -> None:
        tr = self._tracer
        tr._raw.append((self._op, self._start, tr.clock(), self._meta))


class _CpuSpan(_Span):
    """A host compute span: also the CPU time this thread used inside it (a system call
    each edge, about 1 us; its interval nests inside the wall-clock one)."""

    __slots__ = ("_cpu",)

    def __enter__(self) -> _CpuSpan:
        self._start = self._tracer.clock()
        self._cpu = _cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        cpu = _cpu() - self._cpu
        tr = self._tracer
        tr._raw.append((self._op, self._start, tr.clock(), _with_cpu(self._meta, cpu)))


class _ComputeSpan:
    """A compute span that this rank's blocking communication cuts (``Tracer.compute``)."""

    __slots__ = ("_cpu", "_meta", "_op", "_start", "_tracer")

    def __init__(self, tracer: Tracer, op: Op, meta: tuple[Any, ...]):
        self._tracer, self._op, self._meta = tracer, op, meta
        self._start: Any = None
        self._cpu = 0

    def __enter__(self) -> _ComputeSpan:
        tr = self._tracer
        self._start = None if tr._paused else tr.clock()
        self._cpu = _cpu()
        tr._open.append(self)
        return self

    def _cut(self, now: Any) -> None:
        if self._start is not None:
            tr = self._tracer
            # ``now`` was read before this thread's CPU clock: the CPU time of one thread
            # never exceeds the wall time it ran in
            meta = (_with_cpu(self._meta, min(_cpu() - self._cpu, now - self._start))
                    if tr.records_cpu else self._meta)
            tr._raw.append((self._op, self._start, now, meta))
            self._start = None

    def _restart(self, now: Any) -> None:
        self._start = now
        self._cpu = _cpu()

    def __exit__(self, *exc: object) -> None:
        tr = self._tracer
        tr._open.remove(self)
        self._cut(tr.clock())


def _with_cpu(meta: tuple[Any, ...], cpu_ns: int) -> tuple[Any, ...]:
    """``meta`` with the span's thread CPU time in its last field (RAW_FIELDS' ``cpu_ns``)."""
    return (*meta[:-1], cpu_ns)


class _Chain:
    """Compute spans of one step end to end (``Tracer.chain``): one reading of each clock
    ends a span and starts the next, where separate spans read both clocks twice (the thread
    CPU clock is a system call, a few microseconds just after compute)."""

    __slots__ = ("_clock", "_cpu", "_meta", "_op", "_raw", "_start")

    def __init__(self, tracer: Tracer, step: int | None):
        self._raw, self._clock = tracer._raw, tracer.clock
        self._meta: tuple[Any, ...] = (step, *_BEFORE_CPU)
        """The meta fields before ``cpu_ns``, the same for every span of the chain."""
        self._op: Op | None = None
        self._start: Any = 0
        self._cpu = 0

    def next(self, op: Op | None) -> None:
        """End the open span (if any) now and start ``op``'s (None: start none)."""
        now = self._clock()
        if self._op is not None:
            self._raw.append((self._op, self._start, now, self._meta + (None,)))
        self._op, self._start = op, now

    def end(self) -> None:
        """End the open span now."""
        self.next(None)


class _CpuChain(_Chain):
    """A host tracer's chain: each span also carries the CPU time this thread used in it
    (read after the wall clock, so capped by the wall time)."""

    __slots__ = ()

    def next(self, op: Op | None) -> None:
        now = self._clock()
        cpu = _cpu()
        if self._op is not None:
            self._raw.append((self._op, self._start, now,
                              self._meta + (min(cpu - self._cpu, now - self._start),)))
        self._op, self._start, self._cpu = op, now, cpu


class _NullSpan:
    __slots__ = ()

    def __enter__(self) -> _NullSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def next(self, op: Op | None) -> None:
        return None

    def end(self) -> None:
        return None


_NULL = _NullSpan()

_COMPUTE_OPS = frozenset(op._value_ for op in Op if op.lane is Lane.COMPUTE)
"""The ops whose host spans carry the thread's CPU time, by value: ``Op.lane`` is a property
and an enum member's hash a Python call, a string's hash is cached."""

_AFTER_STEP = (None,) * (len(RAW_FIELDS) - 1)
"""Every meta field after ``step`` unset: a span tagged with its step alone."""

_BEFORE_CPU = (None,) * (len(RAW_FIELDS) - 2)
"""Every meta field between ``step`` and ``cpu_ns`` unset."""


Raw = tuple[Op, Any, Any, tuple[Any, ...]]
"""One record as taken: (op, start reading, end reading, meta in RAW_FIELDS order)."""


def raw_to_event(rank: int, raw: Raw, origin_ns: int, offset_ns: int) -> Event:
    """A record with host-ns readings -> an Event on the shared clock."""
    op, start, end, meta = raw
    return Event(rank, op.lane, op, start - origin_ns + offset_ns, max(0, end - start),
                 **dict(zip(RAW_FIELDS, meta)))


class Tracer:
    """Records spans for one rank.

    ``enabled=False`` turns every call into a no-op so a run can be timed without tracing.
    Compute spans also carry the thread CPU time they used (``Event.cpu_ns``).
    """

    records_cpu = True
    """Host-clock spans: the thread's CPU time is what the op cost (a CUDA span's is not)."""

    def __init__(self, rank: int, enabled: bool = True, clock: Any = None):
        self.rank = rank
        self.enabled = enabled
        self.clock = clock or _now
        self.origin_ns = self.clock()
        self._raw: list[Raw] = []
        self._cleared = 0  # records dropped by clear(), so indexes stay global
        self._open: list[_ComputeSpan] = []  # compute spans that blocking comm cuts
        self._paused = 0

    @staticmethod
    def _meta(step: int | None = None, microbatch: int | None = None, stage: int | None = None,
              peer: int | None = None, bytes: int | None = None, bucket: int | None = None,
              chunk: int | None = None, name: str | None = None,
              axis: str | None = None, cpu_ns: int | None = None) -> tuple[Any, ...]:
        return (step, microbatch, stage, peer, bytes, bucket, chunk, name, axis, cpu_ns)

    def _host_span(self, op: Op, step: int | None, meta: dict[str, Any]) -> _Span:
        """A span of ``op``: with this thread's CPU time where it is host compute. A span
        tagged with its step alone (most of them, every step) skips ``_meta``'s keywords."""
        m = self._meta(step, **meta) if meta else (step, *_AFTER_STEP)
        cls = _CpuSpan if self.records_cpu and op._value_ in _COMPUTE_OPS else _Span
        return cls(self, op, m)

    def span(self, op: Op, step: int | None = None, **meta: Any) -> _Span | _NullSpan:
        """``with tracer.span(Op.FORWARD, step=3): ...`` records one span."""
        if not self.enabled:
            return _NULL
        return self._host_span(op, step, meta)

    def compute(self, op: Op, **meta: Any) -> _ComputeSpan | _NullSpan:
        """``with tracer.compute(Op.FORWARD, step=3): ...``: a compute span that is cut while
        this rank blocks in communication (``labkit.trace.comm`` pauses it), so a forward pass with
        tensor-parallel all-reduces inside shows as compute, comm, compute -- not as compute
        overlapping the comm it actually waited for. Several segments, one label."""
        if not self.enabled:
            return _NULL
        return _ComputeSpan(self, op, self._meta(**meta))

    def chain(self, step: int | None) -> _Chain | _NullSpan:
        """Host compute spans of step ``step`` back to back, nothing between them::

            chain = tracer.chain(3)
            chain.next(Op.FORWARD); ...; chain.next(Op.BACKWARD); ...; chain.end()

        records the same spans (and CPU times) as one ``span`` each, with one reading of each
        clock per edge instead of two. For compute ops only, in which no communication
        blocks (a chained span is not cut by it, see ``compute``); on an exception, ``end``
        it as a ``with`` span would."""
        if not self.enabled:
            return _NULL
        return (_CpuChain if self.records_cpu else _Chain)(self, step)

    def detail(self, op: Op, **meta: Any) -> _Span | _NullSpan:
        """A fine-grained span (one layer's matmul) recorded only when no coarser compute span
        is open: inside a pipeline action the action's span already says it computed."""
        if not self.enabled or self._open:
            return _NULL
        return self._host_span(op, meta.pop("step", None), meta)

    def pause_compute(self) -> None:
        """This rank starts waiting (blocking comm): cut every open compute span (nests)."""
        self._paused += 1
        if self._paused == 1 and self._open:
            now = self.clock()
            for span in self._open:
                span._cut(now)

    def resume_compute(self) -> None:
        """The wait is over: open compute spans run again from now."""
        self._paused -= 1
        if self._paused == 0 and self._open:
            now = self.clock()
            for span in self._open:
                span._restart(now)

    def record(self, op: Op, start: Any, end: Any, step: int | None = None, **meta: Any
               ) -> None:
        """Record a span whose edges were measured elsewhere (e.g. an async op's completion)."""
        if self.enabled:
            self._raw.append((op, start, end,
                              self._meta(step, **meta) if meta else (step, *_AFTER_STEP)))

    def now(self) -> Any:
        return self.clock()

    def align(self) -> None:
        """Call right after a barrier: this instant becomes time zero for this rank."""
        self.origin_ns = self.clock()

    def events(self, offset_ns: int = 0) -> list[Event]:
        """Resolve the raw records into Events (``offset_ns`` shifts onto a shared clock)."""
        out = self._to_events(self._raw, offset_ns)
        out.sort(key=lambda ev: ev.start_ns)
        return out

    def raw_since(self, index: int) -> tuple[list[Raw], int]:
        """The raw records after the first ``index`` (in recording order) and the index to
        pass next time: what a spool appends to disk as a rank goes (host-clock tracers)."""
        end = len(self._raw)  # a comm callback may append while we read: stop here
        return self._raw[max(0, index - self._cleared):end], self._cleared + end

    def _to_events(self, raw: list[Raw], offset_ns: int) -> list[Event]:
        return [raw_to_event(self.rank, (op, self._resolve(s), self._resolve(e), meta),
                             self.origin_ns, offset_ns) for op, s, e, meta in raw]

    def _resolve(self, t: Any) -> int:
        return int(t)

    def resolve(self, t: Any) -> int:
        """A ``now()`` reading as host nanoseconds (CUDA: after the events completed)."""
        return self._resolve(t)

    def clear(self) -> None:
        self._cleared += len(self._raw)
        self._raw.clear()


class CudaTracer(Tracer):
    """A tracer whose span edges are CUDA events on the current stream.

    ``clock()`` records an event (no synchronisation). After the step loop, ``events()``
    synchronises once and converts each event to host nanoseconds through a reference
    event recorded together with a host timestamp at ``align()``.
    """

    records_cpu = False  # the host thread only launched the kernels

    def __init__(self, rank: int, enabled: bool = True, torch_cuda: Any = None):
        import torch

        self._cuda = torch_cuda or torch.cuda
        super().__init__(rank, enabled, clock=self._record)
        self._ref_event: Any = None
        self._ref_host_ns = 0
        self.align()

    def _record(self) -> Any:
        ev = self._cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def now(self) -> Any:
        return self._record()

    def align(self) -> None:
        self._cuda.synchronize()
        self._ref_event = self._record()
        self._cuda.synchronize()
        self._ref_host_ns = _now()
        self.origin_ns = self._ref_host_ns

    def _resolve(self, t: Any) -> int:
        if isinstance(t, int):
            return t
        return self._ref_host_ns + int(self._ref_event.elapsed_time(t) * 1e6)

    def events(self, offset_ns: int = 0) -> list[Event]:
        self._cuda.synchronize()
        return super().events(offset_ns)
