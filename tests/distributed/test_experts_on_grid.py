"""Expert parallelism on the rank grid: the MoE GPT with its experts split over an ``ep`` axis
laid over the data ranks equals one process when no token is dropped, and the ep axis's
traced bytes equal what ``labkit.theory`` predicts from the routing (and, with nothing
dropped, ``parallel_layout``'s closed form); every other axis's bytes are exact too.

A tiny GPT (width 32, 2 blocks, 16 tokens, 4 experts) keeps the 4-rank runs to seconds.
"""

from __future__ import annotations

from functools import cache

import pytest

import labkit
from labkit.base.events import Lane, Op
from labkit.theory import parallel_layout

pytestmark = [pytest.mark.distributed, pytest.mark.lesson14]
GPT = {"kind": "gpt", "width": 32, "depth": 2, "heads": 4, "seq_len": 16}
TOL = 1e-5
NO_DROP = 4.0
"""capacity_factor = experts: an expert may take every assignment of the rank."""


@cache
def _run(dp: int, ep: int, cp: int = 1, top_k: int = 2, zero: int = 0,
         capacity: float = NO_DROP) -> labkit.RunResult:
    return labkit.run(strategy="hybrid", model=GPT, steps=2, batch_size=8,
                      check_reference=True, progress=False,
                      options={"dp": dp, "ep": ep, "cp": cp, "experts": 4, "top_k": top_k,
                               "capacity_factor": capacity, "microbatches": 2,
                               "zero_stage": zero})


@pytest.mark.parametrize(("dp", "ep", "cp", "top_k", "zero"), [
    (4, 4, 1, 1, 1), (2, 2, 2, 2, 0), (2, 1, 1, 2, 2)])
def test_moe_gpt_over_ep_equals_one_process_and_its_bytes_are_predicted(dp, ep, cp, top_k, zero):
    r = _run(dp, ep, cp, top_k, zero)
    m = r.metrics
    assert m["dropped_assignments"] == 0
    assert m["max_abs_diff_vs_reference"] <= TOL, m["max_abs_diff_vs_reference"]
    assert m["comm_bytes_per_axis"] == m["predicted_comm_bytes_per_axis"]
    closed = parallel_layout(width=32, depth=2, heads=4, seq_len=16, dp=dp, cp=cp,
                             microbatches=2, batch_size=8, zero_stage=zero, experts=4, ep=ep,
                             top_k=top_k).traffic
    assert closed["ep"] == m["comm_bytes_per_axis"]["ep"]
    assert (m["comm_bytes_per_axis"]["ep"] > 0) == (ep > 1)
    # step 0: every token of the global batch (dp x 8 rows x 16) routed top_k times, 2 layers
    assert sum(m["tokens_per_expert"]) == dp * 8 * 16 * top_k * 2
    a2a = [e for e in r.timeline if e.lane == Lane.COMM and e.op == Op.ALL_TO_ALL]
    assert all(e.axis == "ep" for e in a2a) and bool(a2a) == (ep > 1)


def test_tokens_past_capacity_are_dropped_and_the_bytes_still_follow_the_routing():
    """capacity_factor 0.5: half the even share fits; the dispatch carries only what was
    kept, so measured == predicted from the recorded routing, not from tokens x top_k."""
    r = _run(2, 2, top_k=1, capacity=0.5)
    m = r.metrics
    assert m["dropped_assignments"] > 0 and m["load_imbalance"] >= 1.0
    assert m["comm_bytes_per_axis"]["ep"] == m["predicted_comm_bytes_per_axis"]["ep"]
    closed = parallel_layout(width=32, depth=2, heads=4, seq_len=16, dp=2, microbatches=2,
                             batch_size=8, experts=4, ep=2, top_k=1).traffic["ep"]
    assert m["comm_bytes_per_axis"]["ep"] < closed


def test_expert_options_are_checked_before_any_process_starts():
    for opts, words in (({"dp": 4, "ep": 2, "experts": 4}, "ep (2) must be 1 or dp (4)"),
                        ({"dp": 2, "ep": 2}, "needs --experts"),
                        ({"dp": 2, "experts": 2, "top_k": 3}, "top_k (3) must be <=")):
        with pytest.raises(labkit.ConfigError, match=words.replace("(", r"\(").replace(
                ")", r"\)")):
            labkit.run(strategy="hybrid", model=GPT, steps=1, progress=False, options=opts)
