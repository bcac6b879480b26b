"""The dedicated-core replay: what a run's own schedule takes when every rank has a core of its
own and the wire is the alpha-beta model fitted on this machine.

On a busy laptop a rank that waits for a core looks like a slow rank, or a slow message, and a
timed claim ("1F1B's bubble is GPipe's", "the overlap shortens the step") reads as false. The
trace holds what is needed to take that wait out (issue 32, item 3):

* each compute span's ``cpu_ns``: the CPU time its thread used, i.e. what the op cost without
  the wait for a core (``labkit.trace.tracer``); the Python between spans is scaled by the share
  of a core the rank got during that step's compute;
* each message timed by the run's own messages: what the same message took -- from when it
  could start to its end -- in the run's median step by message time
  (``labkit.analysis.replay_wire.own_costs``: on this machine a step's messages are fast or
  slow together, so one statistic per kind of message added up to no step that ran). Given a
  ``wire``, the alpha-beta model (``labkit.theory.comm``: a ring for the collectives,
  ``alpha + bytes / bandwidth`` for a send) times them instead. The run's own messages carry
  the per-call costs (Python, the backend) that a benchmark's fit leaves out.

``replay(timeline, wire)`` walks every rank's spans in the order the rank ran them and re-times
them as a discrete-event simulation: compute takes its cost; a blocking collective starts when
every rank has reached it (and its previous collective left the wire) and takes the model's
time; an async one (the rank went on before it ended) is only issued, and the rank waits for
it where the measured rank had it back: at a ``wait`` that ended after it (or names its bucket),
and -- a collective's result being what the program goes on with -- at the first span that
began after it ended (DDP's wait for a bucket already done leaves no span, yet the optimizer
needs it); a message is joined at a wait or where the next step begins. A receive ends
when its message (the matching send: ``labkit.base.events.match_sends``) has crossed the wire.
The result is a model built from this run, and says so: a lesson draws it beside the measured
timeline when a timed verdict is not "holds". Collectives on a sub-group of the ranks (tensor
or pipeline axis of a 3D grid) are not replayed: the trace does not name their members.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections import defaultdict
from dataclasses import dataclass

from labkit.analysis.replay_wire import P2P, Instance, Key, own_costs, wire_s
from labkit.analysis.timeline import Timeline
from labkit.base.events import Event, Lane, Op, match_sends
from labkit.base.grid import Grid
from labkit.theory.comm import AlphaBeta

MODEL_LABEL = "replayed on dedicated cores (a model built from this run)"
"""How every replayed number and figure is labelled: never a measurement."""

class ReplayError(ValueError):
    """The trace cannot be replayed (a sub-group collective, a message without its pair)."""


@dataclass
class _Item:
    event: Event
    kind: str  # "work" (compute), "block" (blocking comm), "issue" (async comm), "wait", "mark"
    cost_ns: int = 0
    key: tuple[object, ...] | None = None  # the comm instance this item takes part in


@dataclass
class Replay:
    """The re-timed run. ``timeline`` holds the same spans on the replayed clock."""

    timeline: Timeline
    wire: AlphaBeta | None
    """The alpha-beta model the messages were timed with (None: the run's own messages)."""

    def step_times_s(self) -> list[float]:
        return self.timeline.step_times_s()

    def median_step_s(self) -> float:
        return self.timeline.median_step_s()


def _core_share(events: list[Event]) -> dict[tuple[int, int | None], float]:
    """Per (rank, step): CPU time over wall time of its compute spans (1 where unknown)."""
    cpu: dict[tuple[int, int | None], list[int]] = defaultdict(lambda: [0, 0])
    for e in events:
        if e.lane is Lane.COMPUTE and e.cpu_ns is not None and e.dur_ns > 0:
            acc = cpu[(e.rank, e.step)]
            acc[0] += min(e.cpu_ns, e.dur_ns)
            acc[1] += e.dur_ns
    return {k: (c / w if w else 1.0) for k, (c, w) in cpu.items()}


def _programs(timeline: Timeline) -> dict[int, list[_Item]]:
    """Each rank's spans as the items its main thread went through, in order."""
    events = list(timeline)
    shape = timeline.meta.get("grid")
    grid = Grid(**shape) if isinstance(shape, dict) else None

    def group(e: Event) -> tuple[int, ...]:
        if e.axis is None:
            return tuple(range(timeline.world_size))
        if grid is None or grid.world_size != timeline.world_size:
            raise ReplayError(f"rank {e.rank}: a {e.op.value} on the {e.axis!r} sub-group cannot be "
                              "replayed (the trace's meta names no grid for its members)")
        return tuple(grid.group(e.axis, e.rank))

    pair_of: dict[int, tuple[object, ...]] = {}
    for k, (s, r) in enumerate(match_sends(events)):
        pair_of[id(s)] = pair_of[id(r)] = ("p2p", k)
    counts: dict[tuple[object, ...], int] = defaultdict(int)
    by_rank: dict[int, list[Event]] = defaultdict(list)
    for e in events:
        by_rank[e.rank].append(e)
    programs = {}
    for rank, evs in by_rank.items():
        evs.sort(key=lambda e: (e.start_ns, e.lane is not Lane.STEP))
        work = sorted((e for e in evs if e.lane is Lane.COMPUTE), key=lambda e: e.start_ns)
        starts = [w.start_ns for w in work]
        reach = list(itertools.accumulate((w.end_ns for w in work), max))  # latest end so far
        after = [e for e in evs if e.lane is not Lane.STEP]  # what the rank did next
        following = {id(a): b.start_ns for a, b in itertools.pairwise(after)}
        items: list[_Item] = []
        for e in evs:
            if e.lane is Lane.STEP:
                items.append(_Item(e, "mark"))
            elif e.lane is Lane.COMPUTE:
                cost = e.cpu_ns if e.cpu_ns is not None else e.dur_ns
                items.append(_Item(e, "work", min(cost, e.dur_ns)))
            elif e.op is Op.WAIT:
                items.append(_Item(e, "wait"))
            else:
                if e.op in P2P:
                    key = pair_of.get(id(e))
                    if key is None:
                        raise ReplayError(f"rank {rank}: a {e.op.value} at {e.start_ns} ns has no "
                                          "matching message in the trace")
                else:  # the k-th op of its kind on its group, on every member
                    members = group(e)
                    key = (e.op, members, counts[(rank, e.op, members)])
                    counts[(rank, e.op, members)] += 1
                k = bisect.bisect_left(starts, e.end_ns)  # compute that began before it ended...
                overlapped = k > 0 and reach[k - 1] > e.start_ns  # ...and ran on after it began
                # or the rank went on to its next span before the op ended (it did not block)
                overlapped = overlapped or following.get(id(e), e.end_ns) < e.end_ns
                items.append(_Item(e, "issue" if overlapped else "block", key=key))
        programs[rank] = items
    return programs


def _own_wire(programs: dict[int, list[_Item]],
              members: dict[Key, dict[int, _Item]]) -> dict[Key, int]:
    """Per instance, what the run's own messages say it costs (``replay_wire.own_costs``); a
    collective is ready once its ranks' previous collective has left the wire."""
    queued: dict[Key, int] = {}  # per collective: its ranks' previous one's end
    for items in programs.values():
        last = 0
        for it in items:
            if it.key is not None and it.key[0] != "p2p":
                queued[it.key] = max(queued.get(it.key, 0), last)
                last = max(last, it.event.end_ns)
    return own_costs([Instance(key=key, events=[it.event for it in parties.values()],
                               queued_until_ns=queued.get(key, 0))
                      for key, parties in members.items()])


def replay(timeline: Timeline, wire: AlphaBeta | None = None) -> Replay:
    """Re-time ``timeline`` as if every rank had a core. Messages cost what ``wire`` (an
    alpha-beta model) says; without one, what the same message took in the run's median step
    by message time (``replay_wire.own_costs``)."""
    programs = _programs(timeline)
    share = _core_share(list(timeline))
    ranks = sorted(programs)
    members: dict[tuple[object, ...], dict[int, _Item]] = defaultdict(dict)
    for rank, items in programs.items():
        for it in items:
            if it.key is not None:
                members[it.key][rank] = it
    own = _own_wire(programs, members) if wire is None else {}
    issued: dict[tuple[object, ...], dict[int, int]] = defaultdict(dict)
    done: dict[tuple[object, ...], int] = {}
    wire_free = dict.fromkeys(ranks, 0)
    clock = dict.fromkeys(ranks, 0)
    pos = dict.fromkeys(ranks, 0)
    last_end = {r: (programs[r][0].event.start_ns if programs[r] else 0) for r in ranks}
    new: dict[int, Event] = {}
    within: dict[int, tuple[int, int, int, int]] = {}  # each rank's last compute span, both clocks

    def settle(key: tuple[object, ...]) -> int | None:
        """The instance's end on the replayed clock, once every party has issued it."""
        if key in done:
            return done[key]
        parties = members[key]
        if len(issued[key]) < len(parties) or not parties:
            return None
        first = next(iter(parties.values())).event
        if key[0] == "p2p":
            start = max(issued[key].values())
            end = start + (own[key] if wire is None else
                           int(wire_s(Op.SEND, first.bytes or 0, 2, wire) * 1e9))
        else:
            group_size = len(key[1])  # type: ignore[arg-type]
            if len(parties) != group_size:
                raise ReplayError(f"a {first.op.value} reached {len(parties)} of its "
                                  f"{group_size} ranks")
            start = max(max(issued[key].values()), *(wire_free[r] for r in parties))
            end = start + (own[key] if wire is None else
                           int(wire_s(first.op, first.bytes or 0, len(parties), wire) * 1e9))
            for r in parties:
                wire_free[r] = end
        done[key] = end
        return end

    open_ops: dict[int, list[_Item]] = {r: [] for r in ranks}  # issued, not yet joined

    def joins(r: int, it: _Item) -> list[_Item]:
        """The async ops ``it`` must wait for: those the measured rank had seen complete when
        ``it`` began (a wait: when it ended), and the one a wait names by its bucket. A
        collective's result is what the program goes on with; a message is joined only at a
        wait or where the next step begins (a pipeline waits its sends at the step's end)."""
        e = it.event
        seen = e.end_ns if it.kind == "wait" else e.start_ns
        return [o for o in open_ops[r]
                if (o.event.end_ns <= seen and (it.kind in ("wait", "mark")
                                                or o.event.op not in P2P))
                or (it.kind == "wait" and e.bucket is not None and o.event.bucket == e.bucket
                    and o.event.step == e.step)]

    progress = True
    while progress:
        progress = False
        for r in ranks:
            items = programs[r]
            while pos[r] < len(items):
                it = items[pos[r]]
                e = it.event
                gap = max(0, e.start_ns - last_end[r])
                t = clock[r] + int(gap * share.get((r, e.step), 1.0))
                joined = 0
                if it.kind != "issue":
                    due = joins(r, it)
                    ends = [settle(o.key) for o in due if o.key is not None]
                    if any(x is None for x in ends):
                        break  # another rank has yet to issue one of them
                    joined = max((x for x in ends if x is not None), default=0)
                    open_ops[r] = [o for o in open_ops[r] if o not in due]
                if it.kind == "work":
                    t = max(t, joined)
                    new[id(e)] = dataclasses.replace(e, start_ns=t, dur_ns=it.cost_ns)
                    clock[r], last_end[r] = t + it.cost_ns, e.end_ns
                    within[r] = (e.start_ns, e.end_ns, t, it.cost_ns)
                elif it.kind == "mark":
                    t = max(t, joined)
                    new[id(e)] = dataclasses.replace(e, start_ns=t, dur_ns=0)
                    clock[r], last_end[r] = t, e.start_ns
                elif it.kind == "wait":
                    end = max(t, joined)
                    new[id(e)] = dataclasses.replace(e, start_ns=t, dur_ns=end - t)
                    clock[r], last_end[r] = end, e.end_ns
                else:
                    assert it.key is not None
                    t = max(t, joined)
                    inside = within.get(r)
                    if it.kind == "issue" and inside is not None and e.start_ns < inside[1]:
                        # issued from inside a compute span (a DDP bucket's hook during backward):
                        # at the same share of that span's replayed cost
                        m_start, m_end, r_start, cost = inside
                        t = r_start + int((e.start_ns - m_start) * cost / max(1, m_end - m_start))
                        issued[it.key].setdefault(r, t)
                        open_ops[r].append(it)
                        pos[r] += 1
                        progress = True
                        continue
                    issued[it.key].setdefault(r, t)
                    if it.kind == "issue":
                        open_ops[r].append(it)
                        clock[r], last_end[r] = t, e.start_ns
                    else:
                        end_or_none = settle(it.key)
                        if end_or_none is None:
                            break
                        clock[r], last_end[r] = max(t, end_or_none), e.end_ns
                pos[r] += 1
                progress = True
    for key in list(members):  # async ops nobody waited for (drained at the end of the run)
        settle(key)
    stuck = [r for r in ranks if pos[r] < len(programs[r])]
    if stuck:
        r = stuck[0]
        raise ReplayError(f"rank {r} waits forever at its {programs[r][pos[r]].event.op.value} "
                          f"(item {pos[r]}): the trace's messages do not pair up")
    for items in programs.values():  # comm spans: from issue to the end of their transfer
        for it in items:
            if it.key is not None:
                t0 = issued[it.key][it.event.rank]
                new[id(it.event)] = dataclasses.replace(it.event, start_ns=t0,
                                                        dur_ns=max(0, done[it.key] - t0))
    _close_steps(programs, new, share)
    events = sorted(new.values(), key=lambda ev: ev.start_ns)
    model = ({"model": "dedicated cores, the run's own typical messages"} if wire is None else
             {"model": "dedicated cores, alpha-beta wire", "alpha_s": wire.alpha_s,
              "bandwidth_Bps": wire.bandwidth_Bps})
    meta = dict(timeline.meta, replay=model)
    return Replay(Timeline(events, timeline.world_size, meta), wire)


def _close_steps(programs: dict[int, list[_Item]], new: dict[int, Event],
                 share: dict[tuple[int, int | None], float]) -> None:
    """A step span ends where the last replayed span of that step on its rank ends, plus what
    the rank ran after that span before its step closed (the last step's wrap-up: 1-4 ms on
    this machine), at the rank's core share like every gap."""
    for items in programs.values():
        ends: dict[int | None, int] = defaultdict(int)
        measured: dict[int | None, int] = defaultdict(int)
        for it in items:
            if it.kind != "mark":
                ev = new[id(it.event)]
                ends[ev.step] = max(ends[ev.step], ev.end_ns)
                measured[ev.step] = max(measured[ev.step], it.event.end_ns)
        for it in items:
            if it.kind == "mark":
                m, ev = it.event, new[id(it.event)]
                tail = max(0, m.end_ns - measured.get(m.step, m.end_ns))
                end = ends.get(ev.step, ev.start_ns) + int(tail * share.get((m.rank, m.step), 1.0))
                new[id(m)] = dataclasses.replace(ev, dur_ns=max(0, end - ev.start_ns))
