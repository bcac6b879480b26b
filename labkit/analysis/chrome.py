"""Export a ``Timeline`` as a Chrome / Perfetto trace (open in ui.perfetto.dev).

Layout: one *process* row per rank ("rank 0", "rank 1", ...), and inside it one *thread*
row per lane: compute (tid 0), comm (tid 1), steps (tid 2). Every span is a complete
("X") event with its fields in ``args``. Each send is linked to its matching recv by a
flow arrow: the k-th send from rank a to rank b matches the k-th recv on b from a (point-to-
point messages between two ranks arrive in order). The run config sits in ``metadata``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from labkit.base.events import Event, Lane, Op, match_sends

TIDS = {Lane.COMPUTE: 0, Lane.COMM: 1, Lane.STEP: 2}


def _label(e: Event) -> str:
    if e.name:
        return f"{e.name} [{e.axis}]" if e.axis and e.lane == Lane.COMM else e.name
    if e.op in (Op.SEND, Op.RECV) and e.peer is not None:
        return f"{e.op.value} {'->' if e.op == Op.SEND else '<-'} {e.peer}"
    if e.op == Op.STEP:
        return f"step {e.step}"
    return f"{e.op.value} [{e.axis}]" if e.axis else e.op.value


AXIS_CNAMES = {"dp": "terrible", "pp": "rail_animation", "tp": "good"}
"""chrome://tracing's reserved colour names for each axis's traffic (Perfetto colours by
name; the axis is in every comm span's name and category)."""


def to_chrome_trace(events: Sequence[Event], labels: Sequence[str], meta: dict[str, Any],
                    schema_version: int) -> dict[str, Any]:
    """The Chrome / Perfetto trace of a run: one process row per rank (named by ``labels``,
    rank order), one thread row per lane, a flow arrow per matched send and receive."""
    out: list[dict[str, Any]] = []
    for r, label in enumerate(labels):
        out.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0,
                    "args": {"name": label}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0,
                    "args": {"sort_index": r}})
        for lane, tid in TIDS.items():
            out.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid,
                        "args": {"name": lane.value}})
    for e in events:
        args = {k: v for k, v in e.to_json().items()
                if k not in ("rank", "lane", "op", "start_ns", "dur_ns", "name")}
        span = {"ph": "X", "name": _label(e), "cat": e.op.value, "pid": e.rank,
                "tid": TIDS[e.lane], "ts": e.start_ns / 1e3, "dur": e.dur_ns / 1e3,
                "args": args}
        if e.axis and e.lane == Lane.COMM:
            span["cat"] = f"{e.op.value},{e.axis}"
            span["cname"] = AXIS_CNAMES.get(e.axis, "generic_work")
        out.append(span)
    for flow, (snd, rcv) in enumerate(match_sends(events)):
        out.append({"ph": "s", "id": flow, "name": "p2p", "cat": "p2p", "pid": snd.rank,
                    "tid": TIDS[Lane.COMM], "ts": snd.start_ns / 1e3})
        out.append({"ph": "f", "id": flow, "name": "p2p", "cat": "p2p", "pid": rcv.rank,
                    "tid": TIDS[Lane.COMM], "ts": max(rcv.start_ns, rcv.end_ns - 1) / 1e3,
                    "bp": "e"})
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "metadata": {"labkit_schema_version": schema_version,
                         "world_size": len(labels), **meta}}
