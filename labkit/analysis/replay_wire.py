"""What each message costs in the dedicated-core replay (``labkit.analysis.replay``, issue 32):
the alpha-beta model fitted on this machine (``wire_s``), or the run's own messages
(``own_costs``).

The run's own messages: each instance took, on the wire, the time from when it could start --
its last rank had arrived and its ranks' previous collective had left the wire (a bucket
issued while the one before it still moves waits in the backend's queue, and that wait is
not its cost, or the replay would queue it twice); a message, both ends had arrived -- to its
end. The replay gives every instance what *the same message* took in the run's median step by
message time: the step sums its messages, and on this 2-core machine their times move
together, step by step (a quiet run of naive DDP measured its ten small all-reduces at about
0.4 ms each in one step and about 3.5 ms in the next, docs/benchmarks.md), so no one statistic
per kind of message adds up to a step that ran: one median per kind gave naive DDP 0.4-0.6x its
measured median step. With an even count, each message costs the mean of its two middle steps,
as the median step time is their mean. A message the median step lacks costs its kind's
median (its op, bytes and ranks).

A point-to-point message is different: each one is a copy between two ranks with a floor (the
bytes moved), and what it measured above that floor is the receiver or the sender's thread
waiting for a core -- on a busy laptop the median step's messages carry that wait, and a
pipeline replayed with them idled *more* than the busy run did (lesson 03 at m = 8 beside two
CPU hogs: replayed bubble 0.22-0.42 against measured 0.17-0.26). Every message costs its
kind's lower quartile over the run (``P2P_QUANTILE``): beside two hogs those replays read
0.20-0.33 against measured 0.20-0.32, and on a quiet machine both rules put the replayed step
within 3 % of the measured one (docs/benchmarks.md, 2026-12-01).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from labkit.base.events import Event, Op
from labkit.theory.comm import (
    BUSBW_FACTORS,
    AlphaBeta,
    alpha_beta_time,
    ring_allreduce_steps,
    ring_allreduce_time,
)

P2P = {Op.SEND, Op.RECV}
SCATTERING = {Op.REDUCE_SCATTER, Op.ALL_GATHER, Op.ALL_TO_ALL}

P2P_QUANTILE = 0.25
"""A point-to-point message's cost in the replay: this quantile of its kind's times over the
run (the floor of a copy, without the waits for a core above it; see the module's text)."""

Key = tuple[object, ...]
"""One communication instance: ("p2p", k) for the k-th message, (op, ranks, n) for the n-th
collective of its op on its ranks."""

Slot = tuple[tuple[object, ...], int]
"""A message's place in its step: (its kind, how many of its kind the step sent before it)."""


def wire_s(op: Op, nbytes: int, world_size: int, wire: AlphaBeta) -> float:
    """The alpha-beta time of one op of ``nbytes`` (the bytes the trace recorded for it)."""
    n, a, bw = world_size, wire.alpha_s, wire.bandwidth_Bps
    if op in P2P:
        return alpha_beta_time(1, nbytes, a, bw)
    if n <= 1:
        return 0.0
    if op is Op.ALL_REDUCE:
        return ring_allreduce_time(nbytes, n, a, bw)
    if op in SCATTERING:  # one ring pass over the whole tensor
        return alpha_beta_time(n - 1, BUSBW_FACTORS[op.value](n) * nbytes, a, bw)
    if op is Op.BARRIER:  # an all-reduce of nothing: the ring's messages, no bytes
        return alpha_beta_time(ring_allreduce_steps(n), 0, a, bw)
    return alpha_beta_time(n - 1, nbytes, a, bw)  # broadcast, reduce, gather: along a chain


@dataclass(frozen=True, kw_only=True)
class Instance:
    """One message or collective as measured: every rank's span of it."""

    key: Key
    """Which instance (``Key``): the replay's name for it."""
    events: Sequence[Event]
    """Its span on each rank taking part (a message: the send and the receive)."""
    queued_until_ns: int = 0
    """A collective: when its ranks' previous collective left the wire (0: none before)."""

    def kind(self) -> tuple[object, ...]:
        """(op, bytes, ranks): the messages a missing instance is timed by."""
        first = self.events[0]
        return ("p2p" if self.key[0] == "p2p" else first.op, first.bytes or 0, len(self.events))

    def step(self) -> int | None:
        return self.events[0].step

    def took_ns(self) -> int:
        """From when it could start to its end (a collective: its middle rank's end)."""
        evs = self.events
        if self.key[0] == "p2p":
            send = next((e for e in evs if e.op is Op.SEND), evs[0])
            recv = next((e for e in evs if e.op is Op.RECV), evs[0])
            return max(0, recv.end_ns - max(send.start_ns, recv.start_ns))
        ends = sorted(e.end_ns for e in evs)
        ready = max(self.queued_until_ns, *(e.start_ns for e in evs))
        return max(0, ends[len(ends) // 2] - ready)


def own_costs(instances: Sequence[Instance]) -> dict[Key, int]:
    """Per instance, ns: a collective, what the same collective (its kind's n-th in its step)
    took in the run's median step by message time (the first step, the warm-up, left out as
    ``Timeline.median_step_s`` leaves it), its kind's median where that step has none; a
    point-to-point message, its kind's ``P2P_QUANTILE`` over the run."""
    took = {i.key: i.took_ns() for i in instances}
    by_kind: dict[tuple[object, ...], list[int]] = defaultdict(list)
    slots: dict[Key, Slot] = {}  # instance -> (kind, its place among its step's)
    per_step: dict[int | None, dict[Slot, int]] = defaultdict(dict)
    count: dict[tuple[int | None, tuple[object, ...]], int] = defaultdict(int)
    for inst in sorted(instances, key=lambda i: min(e.start_ns for e in i.events)):
        kind, step = inst.kind(), inst.step()
        by_kind[kind].append(took[inst.key])
        slot = (kind, count[(step, kind)])
        count[(step, kind)] += 1
        slots[inst.key] = slot
        per_step[step][slot] = took[inst.key]
    fallback = {kind: int(statistics.median(t)) for kind, t in by_kind.items()}
    low = {kind: sorted(t)[int(P2P_QUANTILE * len(t))] for kind, t in by_kind.items()
           if kind[0] == "p2p"}
    steps = sorted(s for s in per_step if s is not None)
    timed = steps[1:] if len(steps) > 1 else steps
    ranked = sorted(timed, key=lambda s: (sum(per_step[s].values()), s))
    middle = sorted({ranked[(len(ranked) - 1) // 2], ranked[len(ranked) // 2]}) if ranked else []
    typical = {slot: int(statistics.fmean(per_step[s][slot] for s in middle))
               for slot in per_step[middle[0]] if all(slot in per_step[s] for s in middle)
               } if middle else {}
    return {key: low[slot[0]] if key[0] == "p2p" else typical.get(slot, fallback[slot[0]])
            for key, slot in slots.items()}
