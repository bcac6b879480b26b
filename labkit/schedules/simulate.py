"""Run a plan on paper: event-driven timing with real op costs, bubble and memory.

What this teaches: the "planned" timeline a lesson draws beside a measured run. Each rank
walks its ORDER (``plan.actions(rank)``, exactly what the executor runs) and starts an action
as soon as the rank is free and every input exists; inputs from another rank arrive
``comm_s`` later. The plan's unit-time slots are ignored here -- only the order matters.

Default costs follow the usual convention that a backward costs about twice a forward
(F=1, B=2) and that the zero-bubble split halves it (I=1, W=1) (Qi et al. 2023). With these
costs GPipe (Huang et al. 2019) and 1F1B (Narayanan et al. 2021) both idle
(p-1)/(m+p-1) of the step: the bubble as a share of TOTAL step time (not relative to the
ideal time, which would be (p-1)/m).

Costs are per action. An interleaved action covers one model chunk (1/V of a rank's layers),
so to compare absolute times with a non-interleaved plan pass costs divided by V; bubble
fractions are ratios and do not change when every cost is scaled (with comm_s = 0).

``durations`` replaces the per-op costs with one number per action -- e.g. the durations a
real run measured. Replaying a run this way with ``comm_s = 0`` answers "what bubble would
these exact compute times give if messages were free?", which splits a measured bubble into
the part the schedule and the uneven compute explain and the part communication adds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from labkit.base.errors import ConfigError
from labkit.schedules.actions import Action, Op, Plan, Token, format_plan
from labkit.schedules.validate import ScheduleError

K = TypeVar("K")

DEFAULT_COSTS: dict[Op, float] = {Op.F: 1.0, Op.B: 2.0, Op.I: 1.0, Op.W: 1.0}


@dataclass(frozen=True)
class SimEvent:
    """``action`` ran on ``rank`` from ``start`` to ``end`` (in cost units, e.g. seconds)."""

    rank: int
    action: Action
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start


def _times(given: Mapping[K, float] | None, key_type: type, key_rule: str, what: str,
           example: str) -> dict[K, float]:
    """``given`` checked: keys of ``key_type``, values numbers >= 0 (returned as floats)."""
    out: dict[K, float] = {}
    for key, value in (given or {}).items():
        if not isinstance(key, key_type):
            raise ConfigError(f"{what} key {key!r} must be {key_rule}; e.g. {what}={example}")
        if not isinstance(value, (int, float)) or value < 0:
            label = key.value if isinstance(key, Op) else str(key)
            raise ConfigError(f"{what.rstrip('s')} of {label} ({value!r}) must be a number "
                              f">= 0; e.g. {what}={example}")
        out[key] = float(value)
    return out


def _costs(costs: dict[Op, float] | None) -> dict[Op, float]:
    return {**DEFAULT_COSTS, **_times(costs, Op, "an Op (F, B, I, W)", "costs",
                                      "{Op.F: 1.0, Op.B: 2.0}")}


def _durations(durations: Mapping[Action, float] | None) -> dict[Action, float]:
    return _times(durations, Action, "an Action", "durations", "{Action.parse('0F0'): 0.012}")


def simulate(plan: Plan, costs: dict[Op, float] | None = None,
             comm_s: float = 0.0, durations: Mapping[Action, float] | None = None
             ) -> list[SimEvent]:
    """Time every action of ``plan``; returns events sorted by (start, rank).

    ``costs`` maps ops to durations (missing ops keep the defaults F=1, B=2, I=1, W=1);
    ``durations`` maps single actions to their own duration and wins over ``costs``;
    ``comm_s`` is added whenever an input comes from another rank. Raises ScheduleError if
    the per-rank orders deadlock (some rank waits for an input that is never produced).
    """
    cost = _costs(costs)
    own = _durations(durations)
    if not isinstance(comm_s, (int, float)) or comm_s < 0:
        raise ConfigError(f"comm_s ({comm_s!r}) must be a number >= 0 seconds; e.g. comm_s=0.1")
    orders = {r: plan.actions(r) for r in sorted(plan.order)}
    num_stages = plan.num_model_stages
    pos = dict.fromkeys(orders, 0)
    free_at = dict.fromkeys(orders, 0.0)
    ready: dict[Token, tuple[float, int]] = {}  # token -> (time it exists, producing rank)
    events: list[SimEvent] = []
    progressed = True
    while progressed:
        progressed = False
        for rank, order in orders.items():
            # a rank runs as far down its order as its inputs allow
            while pos[rank] < len(order):
                action = order[pos[rank]]
                needs = action.requires(num_stages)
                if any(t not in ready for t in needs):
                    break
                start = free_at[rank]
                for token in needs:
                    at, producer = ready[token]
                    start = max(start, at + (comm_s if producer != rank else 0.0))
                end = start + own.get(action, cost[action.op])
                events.append(SimEvent(rank, action, start, end))
                for token in action.produces():
                    ready[token] = (end, rank)
                free_at[rank] = end
                pos[rank] += 1
                progressed = True
    stuck = [(r, orders[r][pos[r]]) for r in orders if pos[r] < len(orders[r])]
    if stuck:
        rank = _culprit(orders, pos, set(ready), num_stages)
        slot = plan.order[rank].index(orders[rank][pos[rank]])
        waits = ", ".join(f"rank {r} at {a}" for r, a in stuck)
        message = f"the per-rank orders deadlock: {waits} wait for inputs that are never produced"
        raise ScheduleError([message], format_plan(plan, mark=(rank, slot)))
    events.sort(key=lambda e: (e.start, e.rank))
    return events


def _culprit(orders: dict[int, list[Action]], pos: dict[int, int], ready: set[Token],
             num_stages: int) -> int:
    """The rank to blame for a deadlock: follow "waits for" from the first stuck rank until
    a rank repeats (a cycle) or an input has no producer at all."""
    producer = {t: r for r, order in orders.items() for a in order for t in a.produces()}
    rank = next(r for r in orders if pos[r] < len(orders[r]))
    visited: list[int] = []
    while rank not in visited:
        visited.append(rank)
        missing = [t for t in orders[rank][pos[rank]].requires(num_stages) if t not in ready]
        if not missing or missing[0] not in producer:
            return rank
        rank = producer[missing[0]]
    return visited[-1]


def planned_bubble_fraction(plan: Plan, costs: dict[Op, float] | None = None,
                            comm_s: float = 0.0,
                            durations: Mapping[Action, float] | None = None) -> float:
    """Idle share of the step, averaged over ranks: mean_r (span - busy_r) / span.

    The span runs from time 0 to the last action's end on any rank (the whole step), so this
    is the bubble as a share of total step time; GPipe / 1F1B give (p-1)/(m+p-1).
    """
    events = simulate(plan, costs, comm_s, durations)
    span = max((e.end for e in events), default=0.0)
    if span <= 0:
        return 0.0
    busy = {r: 0.0 for r in plan.order}
    for e in events:
        busy[e.rank] += e.duration
    return sum(span - b for b in busy.values()) / (span * len(busy))


def peak_in_flight(plan: Plan, rank: int) -> int:
    """Most (stage, microbatch) activations ``rank`` holds at once while walking its order.

    An activation is held from its forward until the backward that frees it: B, or W for the
    zero-bubble split (the weight grad still reads the stage input). With one stage per rank
    this counts microbatches: GPipe holds all m, 1F1B rank r holds min(p - r, m). For
    interleaved plans each unit is one chunk's activations (1/V of the rank's layers).
    """
    held: set[tuple[int, int]] = set()
    peak = 0
    for a in plan.actions(rank):
        key = (a.stage, a.microbatch)
        if a.op is Op.F:
            held.add(key)
            peak = max(peak, len(held))
        elif a.op in (Op.B, Op.W):
            held.discard(key)
    return peak
