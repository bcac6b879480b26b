"""Pipeline schedules on paper: simulated timing, bubble, memory, and deadlock freedom."""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest

from labkit.base.errors import ConfigError
from labkit.schedules import (
    Action,
    Op,
    Plan,
    ScheduleError,
    build_plan,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    peak_in_flight,
    planned_bubble_fraction,
    simulate,
    zero_bubble,
)

pytestmark = pytest.mark.lesson03

SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("zb", 1), ("interleaved", 2))


def _all_plans(ps: tuple[int, ...], ms: range) -> list[tuple[str, int, int, int]]:
    return [(s, p, m, v) for s, v in SCHEDULES for p in ps for m in ms
            if s != "interleaved" or m % p == 0]


# --- executor walk: asynchronous sends, blocking receives ---------------------------------

def _walk(plan: Plan) -> dict[int, int]:
    """Walk every rank's order as the executor will, independently of labkit's own
    dependency model, and return how many actions each rank completed.

    Messages: F on stage s sends its activation to the owner of s+1; B/I on stage s sends
    the input gradient to the owner of s-1. Sends never block. A receive blocks until the
    matching send was issued; when both stages live on the same rank the value must already
    be in that rank's local stash (it cannot wait for itself). B/I also need the stage's own
    forward stash, and W needs the stash its I left behind.
    """
    last = plan.num_model_stages - 1
    wire: set[tuple[str, int, int]] = set()  # messages sent: (kind, to stage, microbatch)
    stash: dict[int, set[tuple[str, int, int]]] = {r: set() for r in plan.order}
    orders = {r: plan.actions(r) for r in plan.order}
    done = dict.fromkeys(orders, 0)

    def deliver(rank: int, kind: str, to_stage: int, m: int) -> None:
        local = plan.stage_to_rank(to_stage) == rank
        (stash[rank] if local else wire).add((kind, to_stage, m))

    def ready(rank: int, a: Action) -> bool:
        s, m = a.stage, a.microbatch
        if a.op is Op.F:
            return s == 0 or ("act", s, m) in (stash[rank] | wire)
        if a.op is Op.W:
            return ("input-grad-done", s, m) in stash[rank]
        return ("fwd-done", s, m) in stash[rank] and (
            s == last or ("grad", s, m) in (stash[rank] | wire))

    progress = True
    while progress:
        progress = False
        for rank, order in orders.items():
            while done[rank] < len(order) and ready(rank, order[done[rank]]):
                a = order[done[rank]]
                s, m = a.stage, a.microbatch
                if a.op is Op.F:
                    stash[rank].add(("fwd-done", s, m))
                    if s < last:
                        deliver(rank, "act", s + 1, m)
                elif a.op in (Op.B, Op.I):
                    stash[rank].add(("input-grad-done", s, m))
                    if s > 0:
                        deliver(rank, "grad", s - 1, m)
                done[rank] += 1
                progress = True
    return done


@pytest.mark.parametrize("schedule,p,m,v", _all_plans((1, 2, 3, 4), range(1, 17)))
def test_per_rank_orders_are_deadlock_free(schedule: str, p: int, m: int, v: int) -> None:
    """Each rank walking plan.actions(rank) with async sends and blocking recvs finishes."""
    plan = build_plan(schedule, p, m, v)
    done = _walk(plan)
    stuck = {r: str(plan.actions(r)[n]) for r, n in done.items() if n < len(plan.actions(r))}
    assert not stuck, f"{schedule} p={p} m={m}: ranks stuck at {stuck}"


def test_walk_detects_a_deadlocking_order() -> None:
    """The walker itself catches a cross-rank cycle (so the test above means something)."""
    plan = gpipe(2, 2)
    plan.order[1] = [Action(1, Op.B, 0), Action(1, Op.F, 0), Action(1, Op.F, 1),
                     Action(1, Op.B, 1)]
    assert _walk(plan)[1] == 0


# --- simulate -------------------------------------------------------------------------

@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 7, 8, 16])
def test_bubble_is_p_minus_1_over_m_plus_p_minus_1(schedule: str, p: int, m: int) -> None:
    """With F=1, B=2, GPipe and 1F1B idle exactly (p-1)/(m+p-1) of the step."""
    bubble = planned_bubble_fraction(build_plan(schedule, p, m))
    assert Fraction(bubble).limit_denominator(10_000) == Fraction(p - 1, m + p - 1)


@pytest.mark.parametrize("p,m", [(2, 2), (2, 8), (4, 4), (4, 8), (4, 16)])
def test_interleaved_bubble_is_lower_than_1f1b(p: int, m: int) -> None:
    """V=2 interleaving cuts the bubble to about (p-1)/(V*m+p-1), below 1F1B's."""
    inter = planned_bubble_fraction(interleaved_1f1b(p, m, 2))
    base = planned_bubble_fraction(one_f_one_b(p, m))
    assert inter < base
    assert inter == pytest.approx((p - 1) / (2 * m + p - 1))


@pytest.mark.parametrize("p,m", [(2, 2), (2, 8), (3, 7), (4, 4), (4, 8), (4, 16)])
def test_zero_bubble_is_a_third_of_1f1b_when_m_at_least_p(p: int, m: int) -> None:
    """ZB-H1 with F=I=W=1 idles (p-1)/(3m+p-1): a third of 1F1B's (p-1)-slot bubble."""
    assert planned_bubble_fraction(zero_bubble(p, m)) == pytest.approx((p - 1) / (3 * m + p - 1))
    assert planned_bubble_fraction(zero_bubble(p, m)) < planned_bubble_fraction(one_f_one_b(p, m))


def test_simulate_events_respect_order_costs_and_dependencies() -> None:
    """Events follow each rank's order, last the op's cost, never overlap on a rank, and
    start no earlier than their inputs end (plus comm_s across ranks)."""
    plan = one_f_one_b(3, 5)
    costs = {Op.F: 1.0, Op.B: 3.0}
    events = simulate(plan, costs, comm_s=0.25)
    assert len(events) == 3 * 5 * 2
    end_of = {(e.action.stage, e.action.op, e.action.microbatch): e for e in events}
    for rank in range(3):
        mine = [e for e in events if e.rank == rank]
        assert [e.action for e in mine] == plan.actions(rank)
        assert all(a.end <= b.start for a, b in itertools.pairwise(mine))
    for e in events:
        assert e.duration == costs[e.action.op]
        s, m = e.action.stage, e.action.microbatch
        if e.action.op is Op.F and s > 0:
            assert e.start >= end_of[(s - 1, Op.F, m)].end + 0.25
        if e.action.op is Op.B and s < 2:
            assert e.start >= end_of[(s + 1, Op.B, m)].end + 0.25


def test_simulate_default_costs_make_backward_twice_forward() -> None:
    """Default costs: F=1, B=2 (and I=W=1 for the zero-bubble split)."""
    events = simulate(gpipe(1, 2))
    assert [(str(e.action), e.start, e.end) for e in events] == [
        ("0F0", 0.0, 1.0), ("0F1", 1.0, 2.0), ("0B0", 2.0, 4.0), ("0B1", 4.0, 6.0)]


def test_comm_delay_grows_the_bubble() -> None:
    """A non-zero comm_s between ranks adds idle time."""
    plan = one_f_one_b(4, 8)
    assert planned_bubble_fraction(plan, comm_s=0.5) > planned_bubble_fraction(plan)


def test_measured_durations_replace_the_op_costs() -> None:
    """``durations`` times single actions; the rest keep their op cost."""
    plan = gpipe(2, 2)
    slow = {Action.parse("1F0"): 3.0}
    events = {str(e.action): (e.start, e.end) for e in simulate(plan, durations=slow)}
    assert events["1F0"] == (1.0, 4.0)
    assert events["1F1"] == (4.0, 5.0)  # rank 1 is busy until 4, then F1 costs the default 1
    # the same durations as the defaults give the formula back
    same = {e.action: e.duration for e in simulate(plan)}
    assert planned_bubble_fraction(plan, durations=same) == pytest.approx(1 / 3)
    # one slow stage grows the bubble of the other
    assert planned_bubble_fraction(plan, durations=slow) > 1 / 3


def test_simulate_reports_a_deadlocked_order_with_a_marked_table() -> None:
    """An order where rank 1 waits on its own later action raises ScheduleError."""
    plan = gpipe(2, 1)
    plan.order[1] = [Action(1, Op.B, 0), Action(1, Op.F, 0)]
    with pytest.raises(ScheduleError) as err:
        simulate(plan)
    assert "deadlock" in str(err.value) and "[1B0]" in err.value.table


@pytest.mark.parametrize("kwargs,needle", [
    ({"costs": {Op.F: -1.0}}, "cost of F (-1.0)"),
    ({"costs": {"F": 1.0}}, "costs key 'F'"),
    ({"comm_s": -0.1}, "comm_s (-0.1)"),
    ({"durations": {"0F0": 1.0}}, "durations key '0F0'"),
    ({"durations": {Action.parse("0F0"): -2}}, "duration of 0F0 (-2)"),
])
def test_simulate_rejects_bad_costs(kwargs: dict, needle: str) -> None:
    """Negative or mistyped costs raise ConfigError naming the value."""
    with pytest.raises(ConfigError) as err:
        simulate(gpipe(2, 2), **kwargs)
    assert needle in str(err.value)


# --- memory: microbatches in flight ---------------------------------------------------

@pytest.mark.parametrize("p", [1, 2, 4])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 8, 16])
def test_peak_in_flight_gpipe_holds_all_microbatches(p: int, m: int) -> None:
    """GPipe: every rank holds all m microbatches' activations before its first backward."""
    plan = gpipe(p, m)
    assert [peak_in_flight(plan, r) for r in range(p)] == [m] * p


@pytest.mark.parametrize("p", [1, 2, 4])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 8, 16])
def test_peak_in_flight_1f1b_is_bounded_by_pipeline_depth(p: int, m: int) -> None:
    """1F1B: rank r holds at most min(p - r, m); stage 0 holds min(p, m)."""
    plan = one_f_one_b(p, m)
    assert [peak_in_flight(plan, r) for r in range(p)] == [min(p - r, m) for r in range(p)]


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("m", [1, 3, 4, 8, 16])
def test_zero_bubble_keeps_1f1b_peak_memory(p: int, m: int) -> None:
    """ZB-H1 delays W but never holds more than 1F1B's stage 0 does: min(p, m)."""
    plan = zero_bubble(p, m)
    assert max(peak_in_flight(plan, r) for r in range(p)) == min(p, m)
