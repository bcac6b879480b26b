"""Lessons 09 and 10 read their sentences and byte counts off a run: what crosses the node
boundary (counted from the trace), what the head costs in blocks, and where MFU goes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from labkit.analysis.timeline import Timeline
from labkit.base.events import Event, Lane, Op
from labkit.lessons.cluster_predict import node_uplink_bytes
from labkit.lessons.parallel3d import head_blocks, head_text, mfu_runs_text

MS = 1_000_000


def _step(rank: int, step: int, start: int, end: int) -> Event:
    return Event(rank, Lane.STEP, Op.STEP, start, end - start, step=step)


def _comm(rank: int, op: Op, start: int, nbytes: int, *, peer: int | None = None,
          axis: str | None = None) -> Event:
    return Event(rank, Lane.COMM, op, start, 10, peer=peer, bytes=nbytes, axis=axis)


def test_node_uplink_bytes_counts_only_what_leaves_a_node_in_that_step() -> None:
    """2 nodes x 2 ranks: a send 1 -> 2 crosses (its bytes), a send 0 -> 1 stays inside; an
    all-reduce of P on the "inter" axis over 2 nodes sends 2(k-1)/k x P = P; intra-node
    collectives and anything outside the step span count nothing."""
    events = [_step(r, 0, 0, 1000) for r in range(4)] + [_step(r, 1, 2000, 3000) for r in range(4)]
    events += [_comm(1, Op.SEND, 100, 300, peer=2),        # crosses: node 0 -> node 1
               _comm(0, Op.SEND, 100, 700, peer=1),        # inside node 0
               _comm(3, Op.SEND, 200, 50, peer=0),         # crosses: node 1 -> node 0
               _comm(0, Op.REDUCE, 300, 999, axis="intra"),
               _comm(0, Op.ALL_REDUCE, 400, 400, axis="inter"),
               _comm(2, Op.ALL_REDUCE, 400, 400, axis="inter"),
               _comm(1, Op.SEND, 1500, 1234, peer=3),      # between the steps: not counted
               _comm(2, Op.SEND, 2100, 80, peer=1)]        # step 1
    tl = Timeline(events, 4)
    assert node_uplink_bytes(tl, 2, 0) == [300 + 400, 50 + 400]
    assert node_uplink_bytes(tl, 2, 1) == [0, 80]
    assert node_uplink_bytes(tl, 1, 0)[1] == 300  # one rank per node: rank 1 is node 1


def _pipeline_run(stage_compute_ms: list[float], bounds: list[int], micro: int = 2):
    events = []
    for rank, ms in enumerate(stage_compute_ms):
        for step, scale in ((0, 3.0), (1, 1.0), (2, 1.2)):  # step 0 is warm-up, 2 disturbed
            start = step * 1000 * MS
            events.append(_step(rank, step, start, start + 900 * MS))
            events.append(Event(rank, Lane.COMPUTE, Op.FORWARD, start, int(ms * scale * MS / 3),
                                step=step))
            events.append(Event(rank, Lane.COMPUTE, Op.BACKWARD, start + 400 * MS,
                                int(ms * scale * MS * 2 / 3), step=step))
    return SimpleNamespace(timeline=Timeline(events, len(stage_compute_ms)),
                           metrics={"stage_bounds": bounds},
                           config=SimpleNamespace(options=SimpleNamespace(microbatches=micro)))


def test_head_blocks_reads_the_heads_cost_in_blocks_off_the_least_disturbed_step() -> None:
    """Stage 0 (2 blocks) takes 20 ms per microbatch, stage 1 (2 blocks + head) 35 ms: a block
    is 10 ms, the head 15 ms, 1.5 blocks -- and the sentence says so."""
    run = _pipeline_run([40.0, 70.0], [0, 2, 4])
    h = head_blocks(run)
    assert h["block_ms"] == pytest.approx(10.0, rel=1e-6)
    assert h["head_ms"] == pytest.approx(15.0, rel=1e-6)
    assert h["blocks"] == pytest.approx(1.5, rel=1e-6)
    assert "the head costs about 1.5 blocks" in head_text(run)


def test_head_text_does_not_invent_a_cost_the_run_did_not_show() -> None:
    """A last stage no slower than its blocks: the sentence says the head is lost in noise."""
    run = _pipeline_run([40.0, 38.0], [0, 2, 4])
    assert "lost in the noise" in head_text(run) and "costs about" not in head_text(run)


def _mfu_run(mfu: float, compute_ms: float, step_ms: float):
    events = []
    for step in range(3):
        start = step * 1000 * MS
        events.append(_step(0, step, start, start + int(step_ms * MS)))
        events.append(Event(0, Lane.COMPUTE, Op.FORWARD, start, int(compute_ms * MS), step=step))
    return SimpleNamespace(timeline=Timeline(events, 1), metrics={"mfu": mfu},
                           step_time_s=step_ms / 1e3)


def test_mfu_splits_into_compute_share_and_rate_while_computing() -> None:
    """MFU 0.01 with compute 10% of the step: 10% of the peak while computing, far from it;
    MFU 0.08 at 10%: 80% while computing, so the loss is the time outside compute."""
    text = mfu_runs_text({"a": _mfu_run(0.01, 10.0, 100.0), "b": _mfu_run(0.02, 20.0, 100.0)})
    assert "MFU 0.010 to 0.020" in text
    assert "computed for 10% to 20% of a step" in text and "ran at 10% to 10% of the peak" in text
    assert "far from the peak" in text
    near = mfu_runs_text({"a": _mfu_run(0.08, 10.0, 100.0)})
    assert "near the peak" in near and "far from" not in near
    assert "not reported" in mfu_runs_text({"a": SimpleNamespace(metrics={}, step_time_s=0.1)})
    busy = SimpleNamespace(metrics={"mfu_note": "not reported: the machine is too busy"},
                           step_time_s=0.1)
    both = mfu_runs_text({"a": _mfu_run(0.01, 10.0, 100.0), "busy": busy})
    assert "MFU 0.010 to 0.010" in both and "busy: MFU not reported: the machine is too busy" \
        in both
    untimed = mfu_runs_text({"u": SimpleNamespace(metrics={"mfu": 0.02}, step_time_s=0.0)})
    assert untimed == "u: MFU 0.020, with no timed step to split it over"
