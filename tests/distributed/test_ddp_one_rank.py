"""A one-rank ``ddp`` run trains the bare model (issue 39, the step bench): with one replica
there is nothing to average, so no DDP wrapper, no bucket and no all-reduce -- and the
weights still equal one process on the same batch."""

from __future__ import annotations

import pytest

import labkit

pytestmark = [pytest.mark.distributed, pytest.mark.lesson00]


def test_one_rank_ddp_trains_without_exchanging_anything(no_leftover_ranks):
    res = labkit.run(strategy="ddp", world_size=1, steps=5, check_reference=True,
                     timeout_s=120, progress=False)
    diff = res.metrics["max_abs_diff_vs_reference"]
    assert diff <= 1e-6, f"ddp x1: max abs weight diff {diff} from one process > 1e-6"
    assert res.timeline.select(op=labkit.Op.ALL_REDUCE) == []
    assert res.metrics["buckets"] == 0 and len(res.losses) == 5
    # every step's compute is on the timeline, with its CPU time, though backward is timed
    # without the per-parameter hooks (nothing waits inside a bare model's backward); on a
    # GPU (NCCL) the spans are CUDA events, which carry no CPU time (seen on the H200)
    on_cpu = res.backend == "gloo"
    for op in (labkit.Op.FORWARD, labkit.Op.BACKWARD, labkit.Op.OPTIMIZER, labkit.Op.STEP):
        spans = res.timeline.select(op=op)
        assert [e.step for e in spans] == list(range(5)), (op, spans)
        assert all((e.cpu_ns is not None) == (on_cpu and op is not labkit.Op.STEP)
                   for e in spans), op
    assert res.timeline.select(op=labkit.Op.WAIT) == []
    # they are timed as one chain (``Tracer.chain``): each edge one reading, inside the step
    for step in range(5):
        fwd, bwd, opt, whole = (res.timeline.select(op=op, step=step)[0] for op in (
            labkit.Op.FORWARD, labkit.Op.BACKWARD, labkit.Op.OPTIMIZER, labkit.Op.STEP))
        assert fwd.end_ns == bwd.start_ns and bwd.end_ns == opt.start_ns, step
        assert whole.start_ns <= fwd.start_ns and opt.end_ns <= whole.end_ns, step
        assert not on_cpu or all(e.cpu_ns <= e.dur_ns for e in (fwd, bwd, opt)), step


def test_compression_still_wraps_one_rank(no_leftover_ranks):
    """A compression hook changes the gradients even alone (a cast, a top-k), so ``compress``
    keeps DDP and its hook on one rank: the bytes it sends are still on the timeline."""
    res = labkit.run(strategy="compress", world_size=1, steps=3, timeout_s=120,
                     progress=False, options={"method": "fp16"})
    assert res.timeline.select(op=labkit.Op.ALL_REDUCE), "compress x1 lost its hook"


@pytest.mark.parametrize("strategy, options", [
    ("hybrid", {}), ("pipeline", {"microbatches": 2, "schedule": "1f1b"}), ("zero", {"stage": 1})])
def test_one_rank_grid_engines_send_nothing(no_leftover_ranks, strategy, options):
    """On one rank every grid axis is a group of one, which records nothing and costs nothing
    (``labkit.rank.subgroups``). Before, the axes reused the world's gloo group of one: a
    2-layer GPT's one-rank hybrid step ran 24 all-reduces (3 ms of 24), and the planner's
    one-rank samples charged them to every rank of a layout. The weights are those of one
    process either way: a collective over one rank is the identity."""
    gpt = labkit.ModelConfig(kind="gpt", width=64, depth=2, heads=4, seq_len=32)
    res = labkit.run(strategy=strategy, world_size=1, steps=3, model=gpt, batch_size=8,
                     check_reference=True, timeout_s=120, progress=False, options=options)
    sent = [e for e in res.timeline if e.lane == labkit.Lane.COMM]
    assert sent == [], f"{strategy} x1 recorded {len(sent)} comm spans, e.g. {sent[:2]}"
    diff = res.metrics["max_abs_diff_vs_reference"]
    assert diff <= 1e-5, f"{strategy} x1: max abs weight diff {diff} from one process"
