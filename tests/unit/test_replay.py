"""``labkit.analysis.replay``: a run re-timed as if every rank had a core of its own and the wire
were the fitted alpha-beta model (issue 32, item 3), pinned on hand-made traces whose replayed
times are worked out on paper."""

from __future__ import annotations

import pytest

from labkit.analysis.replay import ReplayError, replay, wire_s
from labkit.analysis.timeline import Timeline
from labkit.base.events import Event, Op
from labkit.theory.comm import AlphaBeta

MS = 1_000_000
WIRE = AlphaBeta(alpha_s=0.0, bandwidth_Bps=1e9)  # 1 MB takes 1 ms, no latency


def ev(rank, op, start_ms, dur_ms, *, cpu_ms=None, step=0, **kw):
    return Event(rank, op.lane, op, int(start_ms * MS), int(dur_ms * MS), step=step,
                 cpu_ns=None if cpu_ms is None else int(cpu_ms * MS), **kw)


def by_op(tl, rank, op):
    return [e for e in tl if e.rank == rank and e.op is op]


def test_wire_times_follow_the_ring_and_a_single_message():
    assert wire_s(Op.ALL_REDUCE, 1_000_000, 2, WIRE) == pytest.approx(1e-3)  # 2(n-1)/n S / B
    assert wire_s(Op.ALL_REDUCE, 1_000_000, 4, WIRE) == pytest.approx(1.5e-3)
    assert wire_s(Op.REDUCE_SCATTER, 1_000_000, 4, WIRE) == pytest.approx(0.75e-3)
    slow = AlphaBeta(alpha_s=1e-4, bandwidth_Bps=1e9)
    assert wire_s(Op.SEND, 1_000_000, 2, slow) == pytest.approx(1.1e-3)
    assert wire_s(Op.ALL_REDUCE, 0, 4, slow) == pytest.approx(6e-4)  # 2(n-1) alphas


def test_waiting_for_a_core_is_taken_out_and_the_all_reduce_follows_the_model():
    """Both ranks measured 10 ms of compute that cost 5 ms of CPU (half a core each), then a
    1 MB all-reduce measured at 4 ms: replayed, 5 ms + 1 ms."""
    events = [ev(r, Op.STEP, 0, 14) for r in (0, 1)]
    events += [ev(r, Op.FORWARD, 0, 10, cpu_ms=5) for r in (0, 1)]
    events += [ev(r, Op.ALL_REDUCE, 10, 4, bytes=1_000_000) for r in (0, 1)]
    rep = replay(Timeline(events, 2), WIRE)
    assert rep.step_times_s() == [pytest.approx(6e-3)]
    ar = by_op(rep.timeline, 0, Op.ALL_REDUCE)[0]
    assert (ar.start_ns, ar.end_ns) == (5 * MS, 6 * MS)
    assert rep.timeline.meta["replay"]["model"].startswith("dedicated cores")


def test_a_straggler_still_makes_the_others_wait():
    """Rank 1's compute really costs 20 ms: the all-reduce cannot start before it ends."""
    events = [ev(0, Op.FORWARD, 0, 10, cpu_ms=10), ev(1, Op.FORWARD, 0, 20, cpu_ms=20)]
    events += [ev(0, Op.ALL_REDUCE, 10, 11, bytes=1_000_000), ev(1, Op.ALL_REDUCE, 20, 1,
                                                                 bytes=1_000_000)]
    tl = replay(Timeline(events, 2), WIRE).timeline
    assert by_op(tl, 0, Op.ALL_REDUCE)[0].end_ns == by_op(tl, 1, Op.ALL_REDUCE)[0].end_ns == 21 * MS


def test_a_pipeline_message_delays_the_next_stage_by_its_wire_time():
    """Stage 0: forward 4 ms, send 1 MB; stage 1: receive, forward 4 ms -> starts at 5 ms."""
    events = [ev(0, Op.FORWARD, 0, 8, cpu_ms=4), ev(0, Op.SEND, 8, 3, peer=1, bytes=1_000_000),
              ev(1, Op.RECV, 0, 11, peer=0, bytes=1_000_000), ev(1, Op.FORWARD, 11, 8, cpu_ms=4)]
    tl = replay(Timeline(events, 2), WIRE).timeline
    assert by_op(tl, 1, Op.RECV)[0].end_ns == 5 * MS
    assert by_op(tl, 1, Op.FORWARD)[0].start_ns == 5 * MS


def test_an_async_all_reduce_hides_under_compute_until_the_wait():
    """DDP's bucket: issued at 2 ms inside backward (which goes on to 6 ms), 2 MB = 2 ms on the
    wire -> done at 4 ms, so the wait at 6 ms costs nothing."""
    events = []
    for r in (0, 1):
        events += [ev(r, Op.BACKWARD, 0, 6, cpu_ms=6), ev(r, Op.ALL_REDUCE, 2, 7, bytes=2_000_000),
                   ev(r, Op.WAIT, 6, 3)]
    tl = replay(Timeline(events, 2), WIRE).timeline
    ar, wait = by_op(tl, 0, Op.ALL_REDUCE)[0], by_op(tl, 0, Op.WAIT)[0]
    assert (ar.start_ns, ar.end_ns) == (2 * MS, 4 * MS)
    assert (wait.start_ns, wait.dur_ns) == (6 * MS, 0)


def test_python_between_spans_is_scaled_by_the_core_share():
    """2 ms of measured gap while the rank had half a core is 1 ms of its own work."""
    events = [ev(0, Op.FORWARD, 0, 4, cpu_ms=2), ev(0, Op.BACKWARD, 6, 4, cpu_ms=2)]
    tl = replay(Timeline(events, 1), WIRE).timeline
    assert by_op(tl, 0, Op.BACKWARD)[0].start_ns == 3 * MS


def test_a_grid_axis_collective_is_matched_within_its_group():
    """tp = 2 on 4 ranks: ranks 0-1 and 2-3 all-reduce apart, so the slow pair (2 ms of compute)
    does not hold up the fast one (1 ms)."""
    events = []
    for r in range(4):
        cost = 1 if r < 2 else 2
        events += [ev(r, Op.FORWARD, 0, cost, cpu_ms=cost),
                   ev(r, Op.ALL_REDUCE, cost, 1, bytes=1_000_000, axis="tp")]
    tl = replay(Timeline(events, 4, {"grid": {"dp": 2, "pp": 1, "tp": 2}}), WIRE).timeline
    assert [by_op(tl, r, Op.ALL_REDUCE)[0].end_ns for r in range(4)] == [2 * MS] * 2 + [3 * MS] * 2


def test_sub_group_collectives_and_unpaired_messages_are_refused_in_words():
    tp = [ev(0, Op.ALL_REDUCE, 0, 1, bytes=4, axis="tp")]
    with pytest.raises(ReplayError, match="all_reduce on the 'tp' sub-group cannot be replayed"):
        replay(Timeline(tp, 2), WIRE)
    with pytest.raises(ReplayError, match="has no matching message"):
        replay(Timeline([ev(0, Op.SEND, 0, 1, peer=1, bytes=4)], 2), WIRE)


def test_every_step_costs_the_messages_of_the_median_step():
    """Naive DDP on this machine: a 1 KB and a 1 MB all-reduce per step, whose times move
    together step by step. After the warm-up (2 + 2 ms), step 1 moved both in 0.5 ms, step 2
    took 0.5 + 3 ms, step 3 took 3 + 0.5 ms: the median step is 1 + 3.5 = 4.5 ms. One median
    per kind (0.5 ms each, over the timed steps) would replay a 2 ms step that never ran; every
    replayed step costs the median step's messages instead, 4.5 ms."""
    took = {0: (2, 2), 1: (0.5, 0.5), 2: (0.5, 3), 3: (3, 0.5)}
    events, t = [], 0.0
    for step, (small, big) in took.items():
        for r in (0, 1):
            events += [ev(r, Op.STEP, t, 1 + small + big, step=step),
                       ev(r, Op.BACKWARD, t, 1, cpu_ms=1, step=step),
                       ev(r, Op.ALL_REDUCE, t + 1, small, bytes=1024, step=step),
                       ev(r, Op.ALL_REDUCE, t + 1 + small, big, bytes=1_000_000, step=step)]
        t += 1 + small + big
    run = Timeline(events, 2)
    assert run.median_step_s() == pytest.approx(4.5e-3)
    rep = replay(run)
    assert rep.step_times_s() == [pytest.approx(4.5e-3)] * 4
    assert [e.dur_ns for e in by_op(rep.timeline, 0, Op.ALL_REDUCE)] == [0.5 * MS, 3 * MS] * 4


def test_a_message_the_median_step_lacks_costs_its_kinds_median():
    """The warm-up sent four 1 KB all-reduces (1, 1, 1, 3 ms), the one timed step three (1, 1,
    0.2 ms): the warm-up's first three cost what the timed step's did, its fourth, which the
    timed step lacks, the kind's median over the run, 1 ms."""
    from labkit.analysis.replay_wire import Instance, own_costs

    def inst(n, took_ms, step):
        return Instance(key=(Op.ALL_REDUCE, (0, 1), n), events=[
            ev(r, Op.ALL_REDUCE, 10 * n, took_ms, bytes=1024, step=step) for r in (0, 1)])

    took = [(1, 0), (1, 0), (1, 0), (3, 0), (1, 1), (1, 1), (0.2, 1)]
    costs = own_costs([inst(n, ms, step) for n, (ms, step) in enumerate(took)])
    assert [costs[(Op.ALL_REDUCE, (0, 1), n)] for n in range(7)] == [
        MS, MS, 0.2 * MS, MS, MS, MS, 0.2 * MS]


def test_a_message_costs_its_kinds_lower_quartile_not_a_wait_for_a_core():
    """Eight 64 KB sends from rank 0 to rank 1, measured 1 ms each but two stretched to 9 and
    12 ms (the receiver waited for a core): each costs the kind's lower quartile, 1 ms, even
    in the step the stretched ones fell in; a 4 KB message is its own kind."""
    from labkit.analysis.replay_wire import Instance, own_costs

    def inst(n, took_ms, step, nbytes=65536):
        return Instance(key=("p2p", n), events=[
            ev(0, Op.SEND, 10 * n, took_ms, bytes=nbytes, step=step),
            ev(1, Op.RECV, 10 * n, took_ms, bytes=nbytes, step=step)])

    took = [1, 1, 9, 12, 1, 1, 1, 1.5]
    costs = own_costs([inst(n, ms, n // 4) for n, ms in enumerate(took)]
                      + [inst(8, 0.3, 1, nbytes=4096)])
    assert [costs[("p2p", n)] for n in range(8)] == [MS] * 8
    assert costs[("p2p", 8)] == 0.3 * MS


def test_a_bucket_queued_behind_the_one_before_is_not_charged_its_queue():
    """Three 1 MB buckets issued together at 5 ms inside backward; the backend moves one at a
    time, 2 ms each, so they end at 7, 9 and 11 ms and measure 2, 4 and 6 ms from their issue.
    Each costs 2 ms on the wire (its start is when the one before left it); the replay queues
    them again, so the wait ends at 11 ms as measured -- not at 5 + 4 + 4 + 4 = 17 ms."""
    events = []
    for r in (0, 1):
        events += [ev(r, Op.STEP, 0, 11), ev(r, Op.BACKWARD, 0, 6, cpu_ms=6)]
        events += [ev(r, Op.ALL_REDUCE, 5, 2 * (b + 1), bytes=1_000_000, bucket=b)
                   for b in range(3)]
        events += [ev(r, Op.WAIT, 6, 5)]
    rep = replay(Timeline(events, 2))
    ends = [e.end_ns for e in by_op(rep.timeline, 0, Op.ALL_REDUCE)]
    assert sorted(ends) == [7 * MS, 9 * MS, 11 * MS]
    assert rep.step_times_s() == [pytest.approx(11e-3)]


def test_a_bucket_whose_wait_left_no_span_is_still_waited_for():
    """The wait for a bucket that was already done when DDP asked leaves no span (< 20 us),
    but the optimizer began after the bucket ended, so it needs it. Backward 4 ms measured, 1 ms
    of CPU: replayed 0-1 ms, the bucket issued at a quarter of it (0.25 ms) and 2 ms on the
    wire (its measured time from launch), done at 2.25 ms: the optimizer waits for it there,
    where without the wait it would start at 1.2 ms on gradients not yet averaged."""
    events = []
    for r in (0, 1):
        events += [ev(r, Op.STEP, 0, 5.5), ev(r, Op.BACKWARD, 0, 4, cpu_ms=1),
                   ev(r, Op.ALL_REDUCE, 1, 2, bytes=1_000_000, bucket=0),
                   ev(r, Op.OPTIMIZER, 4.5, 1, cpu_ms=1)]
    rep = replay(Timeline(events, 2))
    bucket, opt = by_op(rep.timeline, 0, Op.ALL_REDUCE)[0], by_op(rep.timeline, 0, Op.OPTIMIZER)[0]
    assert (bucket.start_ns, bucket.end_ns) == (0.25 * MS, 2.25 * MS)
    assert opt.start_ns == 2.25 * MS
    assert rep.step_times_s() == [pytest.approx(3.25e-3)]


def test_a_bucket_launched_after_backward_keeps_its_place_on_the_wire():
    """Bucket 1 is launched at 2.1 ms, after backward ended, and the rank went on to wait for
    bucket 0 at 2.2 ms: it did not block on bucket 1, so it is async too, and it moves after
    bucket 0 as the backend moved it -- not ahead of it, as a blocking op the rank reached
    first would be."""
    events = []
    for r in (0, 1):
        events += [ev(r, Op.STEP, 0, 7), ev(r, Op.BACKWARD, 0, 2, cpu_ms=2),
                   ev(r, Op.ALL_REDUCE, 1, 3, bytes=1_000_000, bucket=0),
                   ev(r, Op.ALL_REDUCE, 2.1, 3.9, bytes=2_000_000, bucket=1),
                   ev(r, Op.WAIT, 2.2, 1.8, bucket=0), ev(r, Op.WAIT, 4.1, 1.9, bucket=1),
                   ev(r, Op.OPTIMIZER, 6.1, 0.9, cpu_ms=0.9)]
    rep = replay(Timeline(events, 2), WIRE)  # 1 MB: 1 ms, 2 MB: 2 ms
    first, second = by_op(rep.timeline, 0, Op.ALL_REDUCE)
    assert (first.start_ns, first.end_ns) == (1 * MS, 2 * MS)
    assert (second.start_ns, second.end_ns) == (21 * MS // 10, 41 * MS // 10)


def test_a_wait_that_names_its_bucket_waits_for_it_though_its_end_trails_the_wait():
    """The bucket's completion callback stamped 4.005 ms, after its wait returned at 4 ms:
    the wait names bucket 0, so it still lasts until the bucket is done."""
    events = []
    for r in (0, 1):
        events += [ev(r, Op.STEP, 0, 5), ev(r, Op.BACKWARD, 0, 2, cpu_ms=2),
                   ev(r, Op.ALL_REDUCE, 1, 3.005, bytes=3_000_000, bucket=0),
                   ev(r, Op.WAIT, 2, 2, bucket=0)]
    rep = replay(Timeline(events, 2), WIRE)  # 3 MB: 3 ms, from 1 ms
    wait = by_op(rep.timeline, 0, Op.WAIT)[0]
    assert (wait.start_ns, wait.end_ns) == (2 * MS, 4 * MS)


def test_a_sent_message_is_not_waited_for_by_the_next_compute():
    """Stage 0 sends without blocking and computes on; its later forward began after the
    message arrived, but it never needed the message back: replayed (half a core: every span
    at half its time) it starts at 1.75 ms, though the receiver takes the message at 3 ms."""
    events = [ev(0, Op.FORWARD, 0, 1, cpu_ms=0.5), ev(0, Op.SEND, 1, 2, peer=1, bytes=8),
              ev(0, Op.FORWARD, 1.5, 1, cpu_ms=0.5), ev(0, Op.FORWARD, 3.5, 1, cpu_ms=0.5),
              ev(1, Op.FORWARD, 0, 2, cpu_ms=2), ev(1, Op.RECV, 2, 1, peer=0, bytes=8)]
    tl = replay(Timeline(events, 2)).timeline
    assert by_op(tl, 1, Op.RECV)[0].end_ns == 3 * MS
    assert by_op(tl, 0, Op.FORWARD)[2].start_ns == 1.75 * MS


def test_what_a_rank_ran_after_its_last_span_stays_in_its_step():
    """The last step's wrap-up: its forward ends at 2 ms and the step at 5 ms. At half a core
    (2 ms of CPU in 4 ms of forward) the replay keeps 1.5 of those 3 ms: 1 + 1.5 = 2.5 ms."""
    events = [ev(0, Op.STEP, 0, 5), ev(0, Op.FORWARD, 0, 2, cpu_ms=1),
              ev(0, Op.STEP, 5, 8, step=1), ev(0, Op.FORWARD, 5, 2, cpu_ms=1, step=1)]
    rep = replay(Timeline(events, 1))
    assert rep.step_times_s() == [pytest.approx(2.5e-3), pytest.approx(4e-3)]
