"""The one event schema every part of labkit shares.

A rank's tracer records *spans*: what ran (``op``), on which lane (compute or comm), when
(``start_ns``, ``dur_ns`` on one clock shared by all ranks of a run), and the context a lesson
needs (step, microbatch, stage, peer, bytes, bucket, chunk, and for communication the grid
axis it ran on). Trace files, analysis, plots,
the Chrome export and grading all read this shape and nothing else. Bump ``SCHEMA_VERSION``
whenever a field changes meaning.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any

SCHEMA_VERSION = 1

ABORTED = "aborted"
"""The name of a STEP span its rank left by an exception (a failed run's last step)."""


class Lane(enum.Enum):
    """Which row of a rank's timeline a span belongs to."""

    COMPUTE = "compute"
    COMM = "comm"
    STEP = "step"  # one span per training step: the step's boundaries, not work


class Op(enum.Enum):
    """What a span did. Compute ops run math; comm ops move bytes between ranks."""

    # compute
    FORWARD = "forward"
    BACKWARD = "backward"
    BACKWARD_INPUT = "backward_input"  # zero-bubble pipelines split backward in two
    BACKWARD_WEIGHT = "backward_weight"
    RECOMPUTE = "recompute"
    LOSS = "loss"
    OPTIMIZER = "optimizer"
    DATA = "data"
    COMPRESS = "compress"
    CHECKPOINT = "checkpoint"
    STEP = "step"
    # communication
    ALL_REDUCE = "all_reduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"
    BROADCAST = "broadcast"
    GATHER = "gather"
    REDUCE = "reduce"
    ALL_TO_ALL = "all_to_all"
    SEND = "send"
    RECV = "recv"
    BARRIER = "barrier"
    WAIT = "wait"  # blocked waiting for an earlier async op to finish

    @property
    def lane(self) -> Lane:
        if self is Op.STEP:
            return Lane.STEP
        return Lane.COMM if self in _COMM_OPS else Lane.COMPUTE


_COMM_OPS = {Op.ALL_REDUCE, Op.REDUCE_SCATTER, Op.ALL_GATHER, Op.BROADCAST, Op.GATHER,
             Op.REDUCE, Op.ALL_TO_ALL, Op.SEND, Op.RECV, Op.BARRIER, Op.WAIT}


@dataclass(frozen=True, slots=True)
class Event:
    """One span on one rank. Times are nanoseconds since the run's aligned start."""

    rank: int
    lane: Lane
    op: Op
    start_ns: int
    dur_ns: int
    step: int | None = None
    microbatch: int | None = None
    stage: int | None = None
    peer: int | None = None  # the other rank of a send / recv
    bytes: int | None = None  # payload bytes this rank sent (send, collectives) or received (recv)
    bucket: int | None = None
    chunk: int | None = None
    name: str | None = None  # a short label, e.g. "2F0" for stage 2 forward of microbatch 0
    axis: str | None = None  # comm only: the grid axis the op ran on (dp, pp or tp)
    cpu_ns: int | None = None
    """Compute only: the CPU time the recording thread used inside the span (what the op cost,
    without the wait for a core); ``labkit.analysis.replay`` replays a run from it."""

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.dur_ns

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["lane"] = self.lane.value
        d["op"] = self.op.value
        return {k: v for k, v in d.items() if v is not None}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Event:
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["lane"] = Lane(kw["lane"])
        kw["op"] = Op(kw["op"])
        return cls(**kw)


# The order of the optional fields in a raw tracer record (see labkit.trace.tracer).
RAW_FIELDS = ("step", "microbatch", "stage", "peer", "bytes", "bucket", "chunk", "name", "axis",
              "cpu_ns")


def match_sends(events: Iterable[Event]) -> list[tuple[Event, Event]]:
    """Pairs (send, recv): the k-th send from a to b with the k-th recv on b from a (point-to-
    point messages between two ranks arrive in the order they were sent)."""
    sends: dict[tuple[int, int], list[Event]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[Event]] = defaultdict(list)
    for e in sorted(events, key=lambda ev: ev.start_ns):
        if e.op == Op.SEND and e.peer is not None:
            sends[(e.rank, e.peer)].append(e)
        elif e.op == Op.RECV and e.peer is not None:
            recvs[(e.peer, e.rank)].append(e)
    return [pair for key, ss in sends.items() for pair in zip(ss, recvs.get(key, []))]
