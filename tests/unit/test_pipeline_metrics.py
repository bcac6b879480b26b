"""Measured bubble definitions, checked on timings whose answer is known."""

from __future__ import annotations

import pytest

from labkit.analysis.timeline import Timeline
from labkit.base.events import Event, Lane, Op
from labkit.schedules import build_plan, planned_bubble_fraction, simulate
from labkit.strategies.pipeline.metrics import (
    bubble_summary,
    p2p_per_step,
    predictions,
    replayed_bubble,
    stage_times_ms,
    step_stats,
    timeline_bubble,
)

pytestmark = pytest.mark.lesson03


def _events_from_plan(schedule: str, p: int, m: int, steps: int = 2) -> list[Event]:
    """A fake run: the simulated plan (F=1 ms, B=2 ms) repeated for each step."""
    out = []
    for step in range(steps):
        base = step * 10**9
        for e in simulate(build_plan(schedule, p, m)):
            op = Op.FORWARD if e.action.op.value == "F" else Op.BACKWARD
            out.append(Event(e.rank, Lane.COMPUTE, op, base + int(e.start * 1e6),
                             int(e.duration * 1e6), step=step, microbatch=e.action.microbatch,
                             stage=e.action.stage, name=str(e.action)))
    return out


@pytest.mark.parametrize("schedule, p, m", [("gpipe", 2, 4), ("1f1b", 4, 8), ("gpipe", 2, 1)])
def test_measured_bubble_of_an_ideal_run_is_the_formula(schedule: str, p: int, m: int) -> None:
    """On perfectly timed spans the measured bubble is (p-1)/(m+p-1), share of total."""
    tl = Timeline(_events_from_plan(schedule, p, m), p)
    got = timeline_bubble(tl)
    assert got["bubble_fraction"] == pytest.approx((p - 1) / (m + p - 1))
    assert got["bubble_fraction"] == pytest.approx(planned_bubble_fraction(build_plan(
        schedule, p, m)))
    assert got["bubble_fraction_ideal"] == pytest.approx((p - 1) / m)
    assert len(got["bubble_fraction_per_rank"]) == p


def test_window_is_shared_across_ranks() -> None:
    """A rank that works 2 of a 10 ns window idles 0.8, even if its own spans are tight."""
    stats = [[(0, 10, 10)], [(4, 6, 2)]]
    got = bubble_summary(stats, skip_first=False)
    assert got["bubble_fraction_per_rank"] == pytest.approx([0.0, 0.8])
    assert got["bubble_fraction"] == pytest.approx(0.4)
    assert got["pipeline_ms"] == pytest.approx(10 / 1e6)
    assert step_stats([(5, 7), (1, 2)]) == (1, 7, 3)


def test_predictions_use_theory_and_the_plan() -> None:
    plan = build_plan("1f1b", 4, 8)
    pred = predictions("1f1b", 4, 8, 1, plan)
    assert pred["bubble_fraction_predicted"] == pytest.approx(3 / 11)
    assert pred["bubble_fraction_predicted_ideal"] == pytest.approx(3 / 8)
    assert pred["peak_activations_predicted"] == [4, 3, 2, 1]
    zb = predictions("zb", 2, 4, 1, build_plan("zb", 2, 4))
    assert zb["bubble_fraction_predicted"] == zb["bubble_fraction_planned"] < 1 / 5


def test_stage_times_and_p2p_counts() -> None:
    evs = _events_from_plan("gpipe", 2, 2, steps=2)
    evs.append(Event(0, Lane.COMM, Op.SEND, 0, 5, step=1, bytes=100, peer=1))
    evs.append(Event(1, Lane.COMM, Op.SEND, 0, 5, step=1, bytes=50, peer=0))
    assert stage_times_ms(evs) == pytest.approx({0: 3.0, 1: 3.0})  # F=1 ms + B=2 ms
    assert p2p_per_step(evs) == {"p2p_messages_per_step": 2.0, "p2p_bytes_per_step": 150.0}


def test_replay_with_free_messages_removes_only_the_handoff_delay() -> None:
    """Delay every cross-rank handoff by 1 ms: the measured bubble grows, the replay (same
    durations, free messages) stays at the formula, so the difference is the communication."""
    plan = build_plan("1f1b", 2, 4)
    late = simulate(plan, comm_s=1.0)
    evs = []
    for step in range(2):
        for e in late:
            op = Op.FORWARD if e.action.op.value == "F" else Op.BACKWARD
            evs.append(Event(e.rank, Lane.COMPUTE, op, step * 10**9 + int(e.start * 1e6),
                             int(e.duration * 1e6), step=step, microbatch=e.action.microbatch,
                             stage=e.action.stage, name=str(e.action)))
    tl = Timeline(evs, 2)
    measured = timeline_bubble(tl)["bubble_fraction"]
    assert measured == pytest.approx(planned_bubble_fraction(plan, comm_s=1.0))
    assert replayed_bubble(tl, plan) == pytest.approx(1 / 5)
    assert measured > 1 / 5 + 0.05


def test_the_dedicated_replay_times_actions_by_their_cpu_time_not_their_wait():
    """Rank 1's forwards waited for a core (wall 3x their CPU time): replayed with CPU time the
    plan keeps the formula's bubble; with wall times the wait shows as uneven compute."""
    plan = build_plan("gpipe", 2, 4)
    evs = []
    for step in range(2):
        for e in simulate(plan):
            op = Op.FORWARD if e.action.op.value == "F" else Op.BACKWARD
            slow = 3 if e.rank == 1 and op is Op.FORWARD else 1
            evs.append(Event(e.rank, Lane.COMPUTE, op, step * 10**9 + int(e.start * 1e6),
                             int(e.duration * 1e6 * slow), step=step, microbatch=e.action.microbatch,
                             stage=e.action.stage, name=str(e.action), cpu_ns=int(e.duration * 1e6)))
    tl = Timeline(evs, 2)
    assert replayed_bubble(tl, plan) == pytest.approx(1 / 5)
    assert replayed_bubble(tl, plan, dedicated=False) > 1 / 5 + 0.05


def test_overhead_note_only_for_short_actions_far_above_the_formula() -> None:
    from labkit.strategies.pipeline.metrics import overhead_note

    note = overhead_note(0.58, 0.077, 0.2)
    assert note is not None and "0.2 ms" in note and "--batch-size 1024" in note
    assert overhead_note(0.10, 0.077, 0.2) is None  # close enough to the formula
    assert overhead_note(0.58, 0.077, 40.0) is None  # long actions: something else is wrong
