"""The one event schema, the timeline's analysis, and the Chrome export (golden file)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from labkit.analysis.timeline import Timeline, intersect, union
from labkit.base.errors import LabError
from labkit.base.events import SCHEMA_VERSION, Event, Lane, Op, match_sends
from labkit.trace.tracer import Tracer

pytestmark = pytest.mark.lesson00
GOLDEN = Path(__file__).parent / "golden" / "chrome_trace.json"


def ev(rank, op, start, dur, **kw):
    return Event(rank, op.lane, op, start, dur, **kw)


def two_rank_timeline() -> Timeline:
    """Hand-built: rank 0 computes 0-100, all-reduce 60-140 (40 hidden), sends to rank 1."""
    events = [
        ev(0, Op.STEP, 0, 200, step=0), ev(1, Op.STEP, 0, 200, step=0),
        ev(0, Op.FORWARD, 0, 50, step=0), ev(0, Op.BACKWARD, 50, 50, step=0),
        ev(0, Op.ALL_REDUCE, 60, 80, step=0, bytes=4000, bucket=0),
        ev(0, Op.SEND, 150, 10, step=0, peer=1, bytes=64, name="send"),
        ev(1, Op.FORWARD, 0, 100, step=0),
        ev(1, Op.ALL_REDUCE, 100, 40, step=0, bytes=4000, bucket=0),
        ev(1, Op.RECV, 145, 20, step=0, peer=0, bytes=64),
    ]
    return Timeline(events, 2, {"config": {"strategy": "demo"}, "backend": "gloo"})


def test_union_and_intersect():
    assert union([(5, 8), (0, 3), (2, 4), (8, 9)]) == [(0, 4), (5, 9)]
    assert intersect([(0, 4), (6, 10)], [(3, 7)]) == [(3, 4), (6, 7)]


def test_every_op_has_a_lane_and_comm_ops_are_on_the_comm_lane():
    assert Op.ALL_REDUCE.lane == Lane.COMM and Op.SEND.lane == Lane.COMM
    assert Op.FORWARD.lane == Lane.COMPUTE and Op.STEP.lane == Lane.STEP


def test_overlap_is_the_share_of_comm_hidden_under_compute():
    tl = two_rank_timeline()
    assert tl.comm_ns(0) == 80 + 10 and tl.overlap_ns(0) == 40
    assert tl.overlap_ns(1) == 0  # rank 1's all-reduce starts after its compute ends
    assert tl.overlap_fraction() == pytest.approx((40 / 90 + 0) / 2)


def test_idle_fraction_and_bytes_sent():
    tl = two_rank_timeline()
    assert tl.idle_fraction(0) == pytest.approx(1 - 100 / 200)
    assert tl.bytes_sent(0) == 4064 and tl.bytes_sent(1) == 4000  # a recv sends nothing
    assert tl.bytes_sent(0, ops=[Op.SEND]) == 64


def test_json_round_trip_keeps_every_field(tmp_path):
    tl = two_rank_timeline()
    back = Timeline.load(tl.save(tmp_path / "t.json"))
    assert back.events == tl.events and back.meta == tl.meta
    assert back.schema_version == SCHEMA_VERSION


def test_unknown_schema_version_is_refused():
    d = two_rank_timeline().to_json()
    d["schema_version"] = 999
    with pytest.raises(LabError, match="schema_version 999 is not supported"):
        Timeline.from_json(d)


def test_sends_match_recvs_in_order():
    pairs = match_sends(two_rank_timeline().events)
    assert [(s.rank, r.rank) for s, r in pairs] == [(0, 1)]


def test_chrome_trace_matches_golden_file():
    """One process per rank, compute/comm/step thread rows, config metadata, flow arrows."""
    trace = two_rank_timeline().to_chrome()
    if os.environ.get("LABKIT_REGEN_GOLDEN"):  # after a deliberate format change; review it
        GOLDEN.write_text(json.dumps(trace, indent=1, sort_keys=True))
    assert json.loads(json.dumps(trace, sort_keys=True)) == json.loads(GOLDEN.read_text())


def test_chrome_trace_structure():
    trace = two_rank_timeline().to_chrome()
    names = {(e["pid"], e["args"]["name"]) for e in trace["traceEvents"]
             if e.get("name") == "thread_name"}
    assert {(0, "compute"), (0, "comm"), (1, "compute"), (1, "comm")} <= names
    flows = [e for e in trace["traceEvents"] if e["ph"] in ("s", "f")]
    assert [(e["ph"], e["pid"]) for e in flows] == [("s", 0), ("f", 1)]
    assert trace["metadata"]["config"] == {"strategy": "demo"}


def test_tracer_records_spans_and_can_be_switched_off():
    t = iter(range(0, 10_000, 10))
    tr = Tracer(rank=3, clock=lambda: next(t))
    with tr.span(Op.FORWARD, step=1, microbatch=2, stage=0, name="0F2"):
        pass
    tr.record(Op.SEND, 40, 70, peer=1, bytes=8)
    events = tr.events()
    assert [(e.op, e.start_ns, e.dur_ns) for e in events] == [(Op.FORWARD, 10, 10),
                                                              (Op.SEND, 40, 30)]
    assert events[0].name == "0F2" and events[0].rank == 3 and events[1].peer == 1
    off = Tracer(rank=0, enabled=False)
    with off.span(Op.FORWARD):
        pass
    off.record(Op.SEND, 0, 1)
    assert off.events() == []


def test_step_times_and_window():
    tl = two_rank_timeline()
    assert tl.step_times_s() == [200 / 1e9]
    assert tl.window([0]).events == tl.events


def test_finished_steps_leave_out_a_step_its_rank_aborted():
    from labkit.base.events import ABORTED

    events = [Event(0, Lane.STEP, Op.STEP, 10 * s, 5, step=s) for s in range(3)]
    events.append(Event(0, Lane.STEP, Op.STEP, 30, 5, step=3, name=ABORTED))
    events.append(Event(1, Lane.STEP, Op.STEP, 0, 5, step=0))
    tl = Timeline(events, 2)
    assert tl.finished_steps(0) == [0, 1, 2]
    assert tl.finished_steps(1) == [0]


def test_compute_spans_carry_their_thread_cpu_time_and_a_sleep_costs_none():
    """Issue 32's replay reads what an op cost without the wait for a core: a compute span's
    ``cpu_ns`` is the recording thread's CPU time (busy work: the CPU it used, however long it
    waited for a core; a sleep: about none);
    comm spans carry none."""
    import time

    from labkit.base.events import Op
    from labkit.trace.tracer import Tracer

    tr = Tracer(0)
    with tr.compute(Op.FORWARD, step=0):  # spin until this thread has used 20 ms of CPU
        end = time.thread_time_ns() + 20_000_000
        while time.thread_time_ns() < end:
            pass
    with tr.span(Op.BACKWARD, step=0):
        time.sleep(0.02)
    with tr.span(Op.ALL_REDUCE, step=0, bytes=4):
        pass
    fwd, bwd, comm = tr.events()
    assert fwd.cpu_ns is not None and 20_000_000 <= fwd.cpu_ns <= fwd.dur_ns, fwd
    assert bwd.cpu_ns is not None and bwd.cpu_ns < 5_000_000 < bwd.dur_ns, bwd
    assert comm.cpu_ns is None
    assert fwd.to_json()["cpu_ns"] == fwd.cpu_ns


def test_a_chain_records_back_to_back_spans_with_their_cpu_time():
    """``Tracer.chain`` (a one-rank step's forward, backward and optimizer) records what one
    ``span`` each records, end to end: one reading per edge serves two spans."""
    import time

    tr = Tracer(0)
    chain = tr.chain(7)
    chain.next(Op.FORWARD)
    end = time.thread_time_ns() + 10_000_000
    while time.thread_time_ns() < end:  # 10 ms of this thread's CPU
        pass
    chain.next(Op.BACKWARD)
    time.sleep(0.01)  # wall time, hardly any CPU
    chain.next(Op.OPTIMIZER)
    chain.end()
    fwd, bwd, opt = tr.events()
    assert [e.op for e in (fwd, bwd, opt)] == [Op.FORWARD, Op.BACKWARD, Op.OPTIMIZER]
    assert {e.step for e in (fwd, bwd, opt)} == {7}
    assert fwd.end_ns == bwd.start_ns and bwd.end_ns == opt.start_ns
    assert fwd.cpu_ns is not None and 10_000_000 <= fwd.cpu_ns <= fwd.dur_ns, fwd
    assert bwd.cpu_ns is not None and bwd.cpu_ns < 5_000_000 < bwd.dur_ns, bwd
    assert opt.cpu_ns is not None and opt.cpu_ns <= opt.dur_ns
    assert Tracer(0, enabled=False).chain(0).next(Op.FORWARD) is None  # tracing off: nothing



def test_a_skewed_pipelines_step_period_is_end_to_end_not_the_span() -> None:
    """Rank 1 (a last stage) starts each step 30 ns before rank 0 ends the previous one: each
    step spans 130 ns from the earliest start, yet adds 100 ns to the run."""
    events = []
    for s in range(4):
        events += [ev(0, Op.STEP, 100 * s, 100, step=s), ev(1, Op.STEP, 100 * s - 30, 100, step=s)]
    tl = Timeline(events, 2, {})
    assert tl.step_times_s()[1:] == [130e-9] * 3
    assert tl.step_periods_s() == [100e-9] * 3
    assert tl.median_step_period_s() == 100e-9 and tl.median_step_s() == 130e-9
