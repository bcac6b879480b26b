"""The grader's side of a relayed exercise: rank boxes, and the relay between them.

Every message between the ranks of a relayed exercise (:mod:`relay_rank`) passes through
:class:`Relay`, in the grader's own process: it matches a send with the receive posted for
it (per sender, receiver and tag, in posting order, as gloo does), combines the parts of a
collective itself, and records each message (sender, receiver, bytes, the case it belongs
to) on a :class:`~labkit.analysis.timeline.Timeline` of its own clock. The ranks have no
process group and no shared network, files, memory or processes (each is a box of its
own), so the record is complete: a collective the student hid elsewhere has nowhere to run.

The relay also sees what a timeout would only guess: when every rank that has not
finished waits for something no rank can still send, it stops at once and says who
waits for whom (a recv without a send, a collective one rank skipped).

:class:`~labkit.grading.sandbox.rank_boxes.RankBoxes` starts the boxes and runs launches
through a relay; :mod:`combine` computes what a collective gives each rank.
"""

from __future__ import annotations

import base64
import select
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from labkit.base.errors import LabError
from labkit.base.events import Event, Lane, Op
from labkit.grading.sandbox.box import POLL_S, Box, BoxTimeout
from labkit.grading.sandbox.combine import KINDS, REDUCE, combine
from labkit.grading.sandbox.relay_rank import TAGS, pack, unpack

MAX_RELAYED = 256 * 2**20  # bytes one launch may move in all
KEPT_PAYLOADS = 16 * 2**20  # bytes of message contents a record keeps for the checks


class RelayError(LabError):
    """A rank failed, broke the relay's rules, or the ranks deadlocked; ``rank`` names it."""

    def __init__(self, message: str, rank: int | None = None, traceback: str = ""):
        self.rank, self.traceback = rank, traceback
        super().__init__(message)


@dataclass
class _Posted:
    """A receive or collective a rank posted, and (once there) its answer."""

    rid: int
    what: str
    peer: int | None = None
    tag: int = 0
    nbytes: int = 0
    answer: dict[str, Any] | None = None
    posted_ns: int = 0


@dataclass
class _Rank:
    rank: int
    box: Box
    posted: dict[int, _Posted] = field(default_factory=dict)
    waiting: int | None = None
    waited_ns: int = 0
    case: int | None = None
    case_ns: int = 0
    last_case: int = -1  # the last case begun: cases begin once each, in rising order
    collectives: int = 0
    done: bool = False
    result: Any = None
    error: dict[str, Any] | None = None


@dataclass
class Record:
    """What the relay carried, per rank and case: the grader's own count."""

    sent_bytes: dict[tuple[int, int | None], int] = field(default_factory=dict)
    messages: dict[tuple[int, int | None], int] = field(default_factory=dict)
    peers: dict[tuple[int, int | None], set[int]] = field(default_factory=dict)
    collectives: dict[tuple[int, int | None], list[str]] = field(default_factory=dict)
    payloads: dict[tuple[int, int | None], list[dict[str, str]]] = field(default_factory=dict)
    """What each message carried (packed tensors), while under ``KEPT_PAYLOADS`` in all."""
    unkept: dict[tuple[int, int | None], int] = field(default_factory=dict)
    """Messages whose contents were not kept (over ``KEPT_PAYLOADS``): a check that reads
    contents cannot vouch for them."""
    kept: int = 0

    def add_send(self, rank: int, case: int | None, peer: int, nbytes: int,
                 tensor: dict[str, str]) -> None:
        key = (rank, case)
        self.sent_bytes[key] = self.sent_bytes.get(key, 0) + nbytes
        self.messages[key] = self.messages.get(key, 0) + 1
        self.peers.setdefault(key, set()).add(peer)
        if self.kept + nbytes <= KEPT_PAYLOADS:
            self.kept += nbytes
            self.payloads.setdefault(key, []).append(tensor)
        else:
            self.unkept[key] = self.unkept.get(key, 0) + 1

    def add_collective(self, rank: int, case: int | None, kind: str) -> None:
        self.collectives.setdefault((rank, case), []).append(kind)

    def move(self, rank: int, case: int) -> None:
        """File what ``rank`` sent before its first case under that case."""
        for table in (self.sent_bytes, self.messages, self.unkept):
            if (rank, None) in table:
                table[(rank, case)] = table.get((rank, case), 0) + table.pop((rank, None))
        if (rank, None) in self.peers:
            self.peers.setdefault((rank, case), set()).update(self.peers.pop((rank, None)))
        for lists in (self.collectives, self.payloads):
            if (rank, None) in lists:
                lists.setdefault((rank, case), [])[:0] = lists.pop((rank, None))  # type: ignore


class Relay:
    """Runs one launch: reads every rank's frames, answers them, records the traffic."""

    def __init__(self, boxes: Sequence[Box], deadline: float,
                 watch: Callable[[], None] | None = None):
        self.ranks = [_Rank(r, box) for r, box in enumerate(boxes)]
        self.world_size = len(boxes)
        self.deadline, self.watch = deadline, watch
        self.mail: dict[tuple[int, int, int], deque[tuple[dict[str, Any], int, int]]] = {}
        self.unmatched: dict[tuple[int, int, int], deque[int]] = {}
        self.groups: dict[int, dict[int, tuple[_Posted, dict[str, Any], int]]] = {}
        self.events: list[Event] = []
        self.record = Record()
        self.relayed = 0
        self.t0 = time.monotonic_ns()

    # ---- the loop -------------------------------------------------------------------------
    def run(self) -> list[Any]:
        """Every rank's result (plain data), in rank order; RelayError / BoxTimeout otherwise."""
        checked = time.monotonic()
        while not all(r.done for r in self.ranks):
            now = time.monotonic()
            if now >= self.deadline:
                raise BoxTimeout("the ranks did not finish before the time limit")
            if self.watch is not None and now - checked >= POLL_S:
                checked = now
                self.watch()
            live = [r for r in self.ranks if not r.done]
            if not any(r.box.pending() for r in live):
                ready = select.select([r.box for r in live], [], [],
                                      min(POLL_S, self.deadline - now))[0]
                for box in ready:
                    box.feed()
            for rank in live:
                while not rank.done and (frame := rank.box.next_message()) is not None:
                    self._frame(rank, frame)
            failed = next((r for r in self.ranks if r.error is not None), None)
            if failed is not None and failed.error is not None:
                err = failed.error
                trace = str(err.get("traceback", ""))
                raise RelayError(f"rank {failed.rank} raised {err.get('ename', 'Error')}: "
                                 f"{err.get('evalue', '')}" + (f"\n{trace[-800:]}" if trace else ""),
                                 failed.rank, trace)
            self._check_deadlock()
        return [r.result for r in self.ranks]

    def _ns(self) -> int:
        return time.monotonic_ns() - self.t0

    def _frame(self, rank: _Rank, frame: Any) -> None:
        try:
            op = frame["op"]
            if op == "send":
                self._send(rank, int(frame["peer"]), int(frame["tag"]), frame["tensor"])
            elif op == "recv":
                self._recv(rank, int(frame["rid"]), int(frame["peer"]), int(frame["tag"]),
                           int(frame["nbytes"]))
            elif op == "coll":
                self._collective(rank, int(frame["rid"]), frame)
            elif op == "wait":
                self._wait(rank, int(frame["rid"]))
            elif op == "step":
                self._step(rank, int(frame["case"]), frame["edge"] == "begin")
            elif op == "done":
                rank.done, rank.result, rank.error = True, frame.get("result"), frame.get("error")
            else:
                raise ValueError(f"unknown frame {op!r}")
        except (KeyError, TypeError, ValueError) as exc:
            rank.done = True
            rank.error = {"ename": "RelayError", "evalue": f"rank {rank.rank} broke the relay's "
                          f"rules ({exc}); use ctx.comm's send / recv / isend / irecv and its "
                          "collectives", "traceback": ""}

    # ---- point to point -------------------------------------------------------------------
    def _peer(self, rank: _Rank, peer: int, tag: int) -> None:
        if not 0 <= peer < self.world_size or peer == rank.rank or not 0 <= tag < TAGS:
            raise ValueError(f"peer {peer} / tag {tag}")

    def _send(self, rank: _Rank, dst: int, tag: int, tensor: Any) -> None:
        self._peer(rank, dst, tag)
        nbytes = len(base64.b64decode(tensor["b64"], validate=True))
        self.relayed += nbytes
        if self.relayed > MAX_RELAYED:
            raise ValueError(f"more than {MAX_RELAYED} B relayed in one launch")
        now = self._ns()
        self.record.add_send(rank.rank, self._charged(rank), dst, nbytes, tensor)
        self.events.append(Event(rank.rank, Lane.COMM, Op.SEND, now, 0, step=rank.case,
                                 peer=dst, bytes=nbytes))
        key = (rank.rank, dst, tag)
        waiting = self.unmatched.get(key)
        if waiting:
            self._deliver(self.ranks[dst], waiting.popleft(), tensor, nbytes, rank.rank)
        else:
            self.mail.setdefault(key, deque()).append((tensor, nbytes, now))

    def _recv(self, rank: _Rank, rid: int, src: int, tag: int, nbytes: int) -> None:
        self._peer(rank, src, tag)
        rank.posted[rid] = _Posted(rid, "recv", src, tag, nbytes, posted_ns=self._ns())
        key = (src, rank.rank, tag)
        queued = self.mail.get(key)
        if queued:
            tensor, size, _ = queued.popleft()
            self._deliver(rank, rid, tensor, size, src)
        else:
            self.unmatched.setdefault(key, deque()).append(rid)

    def _deliver(self, rank: _Rank, rid: int, tensor: Any, nbytes: int, src: int) -> None:
        posted = rank.posted[rid]
        if nbytes != posted.nbytes:
            posted.answer = {"op": "data", "rid": rid, "error": f"rank {src} sent {nbytes} B "
                             f"but rank {rank.rank} receives into {posted.nbytes} B"}
        else:
            posted.answer = {"op": "data", "rid": rid, "tensor": tensor}
        self._answer_if_waiting(rank)

    def _wait(self, rank: _Rank, rid: int) -> None:
        if rid not in rank.posted:
            raise ValueError(f"wait for {rid}, which was never posted")
        rank.waiting, rank.waited_ns = rid, self._ns()
        self._answer_if_waiting(rank)

    def _answer_if_waiting(self, rank: _Rank) -> None:
        posted = rank.posted.get(rank.waiting) if rank.waiting is not None else None
        if posted is None or posted.answer is None:
            return
        end = self._ns()
        if posted.what == "recv":
            self.events.append(Event(rank.rank, Lane.COMM, Op.RECV, rank.waited_ns,
                                     end - rank.waited_ns, step=rank.case, peer=posted.peer,
                                     bytes=posted.nbytes))
        rank.waiting = None
        del rank.posted[posted.rid]
        rank.box.send(posted.answer)

    # ---- collectives, combined here -------------------------------------------------------
    def _collective(self, rank: _Rank, rid: int, frame: dict[str, Any]) -> None:
        kind, reduce = str(frame["kind"]), str(frame.get("reduce", "sum"))
        if kind not in KINDS or reduce not in REDUCE:
            raise ValueError(f"collective {kind!r} / reduce {reduce!r}")
        posted = _Posted(rid, kind, nbytes=int(frame.get("out", 0)), posted_ns=self._ns())
        rank.posted[rid] = posted
        k = rank.collectives
        rank.collectives += 1
        self.record.add_collective(rank.rank, self._charged(rank), kind)
        group = self.groups.setdefault(k, {})
        group[rank.rank] = (posted, frame, rank.case if rank.case is not None else -1)
        if len(group) == self.world_size:
            del self.groups[k]
            self._combine(group)

    def _combine(self, group: dict[int, tuple[_Posted, dict[str, Any], int]]) -> None:
        import torch

        frames = {r: f for r, (_, f, _) in group.items()}
        kinds = {f["kind"] for f in frames.values()}
        answers: dict[int, dict[str, Any]] = {}
        try:
            if len(kinds) > 1:
                raise ValueError("the ranks called different collectives: " + ", ".join(
                    f"rank {r} {f['kind']}" for r, f in sorted(frames.items())))
            kind = kinds.pop()
            parts = {r: unpack(f["tensor"]) if f.get("tensor") else None
                     for r, f in frames.items()}
            outs = {r: group[r][0].nbytes for r in frames}
            results = combine(kind, frames, parts, outs, self.world_size, torch)
            for r, value in results.items():
                answers[r] = {"op": "data", "tensor": pack(value)} if value is not None \
                    else {"op": "data"}
        except (ValueError, RuntimeError, TypeError) as exc:
            answers = {r: {"op": "data", "error": str(exc)} for r in frames}
        end = self._ns()
        for r, (posted, frame, case) in group.items():
            posted.answer = {**answers[r], "rid": posted.rid}
            size = len(base64.b64decode(frame["tensor"]["b64"])) if frame.get("tensor") else 0
            self.events.append(Event(r, Lane.COMM, Op(posted.what), posted.posted_ns,
                                     end - posted.posted_ns, step=None if case < 0 else case,
                                     bytes=max(size, posted.nbytes)))
            self._answer_if_waiting(self.ranks[r])

    # ---- cases and deadlocks ----------------------------------------------------------------
    @staticmethod
    def _charged(rank: _Rank) -> int | None:
        """The case a message counts for: the open one, else the one that ended last (so
        a rank that marks a case's end early still pays for what it sends next), else
        None, which the first case takes over when it begins."""
        if rank.case is not None:
            return rank.case
        return rank.last_case if rank.last_case >= 0 else None

    def _step(self, rank: _Rank, case: int, begin: bool) -> None:
        """A case's edge. The harness marks cases 0, 1, 2 ... once each, in order; the
        rank's own code shares its pipe and could write such a frame too, so any other
        order (a case begun twice, an end without its begin) breaks the relay's rules."""
        now = self._ns()
        if begin and (rank.case is not None or case <= rank.last_case):
            raise ValueError(f"case {case} begun again, or inside case {rank.case}")
        if not begin and case != rank.case:
            raise ValueError(f"case {case} ended while case {rank.case} is open")
        if begin:
            if rank.last_case < 0:
                self.record.move(rank.rank, case)
            rank.case, rank.case_ns, rank.last_case = case, now, case
        else:
            self.events.append(Event(rank.rank, Lane.STEP, Op.STEP, rank.case_ns,
                                     now - rank.case_ns, step=case))
            rank.case = None

    def _check_deadlock(self) -> None:
        live = [r for r in self.ranks if not r.done]
        if not live or any(r.waiting is None for r in live):
            return
        waits = []
        for r in live:
            posted = r.posted[r.waiting]  # type: ignore[index]
            if posted.what == "recv":
                waits.append(f"rank {r.rank} waits for a message from rank {posted.peer} "
                             f"(tag {posted.tag}, {posted.nbytes} B)")
            else:
                waits.append(f"rank {r.rank} waits in {posted.what} for the other ranks")
        done = [r.rank for r in self.ranks if r.done]
        raise RelayError("deadlock: " + "; ".join(waits) + (
            f"; rank(s) {done} already returned" if done else "") +
            ". A recv needs a matching send, and every rank must call each collective.")

    def timeline(self) -> Any:
        from labkit.analysis.timeline import Timeline

        return Timeline(sorted(self.events, key=lambda e: e.start_ns), self.world_size,
                        meta={"relayed": True})
