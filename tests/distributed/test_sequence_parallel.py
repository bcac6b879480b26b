"""Sequence parallelism (Korthikanti et al. 2022) on real gloo ranks: the GPT trained with
``sequence_parallel`` equals one process, its tensor-parallel traffic is exactly what
``labkit.theory.parallel_layout`` predicts (the same activation bytes as TP's all-reduces,
plus the gathers at the ends and the LayerNorm/bias gradient sums), and the blocks'
LayerNorms keep 1/t of the bytes they keep without it.

A tiny GPT (width 32, 2 blocks, 16 tokens) keeps the 4-rank runs to seconds.
"""

from __future__ import annotations

from functools import cache

import pytest

import labkit
from labkit.base.events import Lane, Op

pytestmark = [pytest.mark.distributed, pytest.mark.lesson14]
GPT = {"kind": "gpt", "width": 32, "depth": 2, "heads": 4, "seq_len": 16}
TOL = 1e-5


@cache
def _run(dp: int, pp: int, tp: int, sp: bool = True, zero: int = 0) -> labkit.RunResult:
    return labkit.run(strategy="hybrid", model=GPT, steps=2, batch_size=8,
                      check_reference=True, progress=False,
                      options={"dp": dp, "pp": pp, "tp": tp, "microbatches": 2,
                               "zero_stage": zero, "sequence_parallel": sp})


@pytest.mark.parametrize(("dp", "pp", "tp", "zero"), [(1, 1, 2, 0), (1, 1, 4, 0),
                                                      (2, 1, 2, 1), (1, 2, 2, 0)])
def test_sequence_parallel_equals_one_process_and_its_traffic_is_predicted(dp, pp, tp, zero):
    r = _run(dp, pp, tp, zero=zero)
    m = r.metrics
    assert m["max_abs_diff_vs_reference"] <= TOL, m["max_abs_diff_vs_reference"]
    for axis, got in m["comm_bytes_per_axis"].items():
        assert got == m["predicted_comm_bytes_per_axis"][axis], (axis, got, m[
            "predicted_comm_bytes_per_axis"])
    ops = {e.op for e in r.timeline if e.lane == Lane.COMM and e.axis == "tp"}
    assert {Op.ALL_GATHER, Op.REDUCE_SCATTER} <= ops


def test_the_activation_traffic_equals_tensor_parallel_all_reduces():
    """Same wire bytes for the activations: an all-reduce is a reduce-scatter + all-gather.
    What SP adds on top is the two end gathers and the 6 h-vector gradient sums per block."""
    sp, tp = _run(1, 1, 2, sp=True), _run(1, 1, 2, sp=False)
    assert tp.metrics["max_abs_diff_vs_reference"] <= TOL
    t, h, act = 2, GPT["width"], 4 * GPT["seq_len"] * GPT["width"] * 4  # rows 4, fp32
    extra = t * 2 * (t - 1) / t * (2 * act + GPT["depth"] * 2 * 24 * h)  # per step, all ranks
    assert sp.metrics["comm_bytes_per_axis"]["tp"] - tp.metrics["comm_bytes_per_axis"]["tp"] \
        == pytest.approx(extra, rel=1e-12)


@pytest.mark.parametrize("tp", [2, 4])
def test_layer_norm_activations_per_rank_divide_by_t(tp):
    """Measured (saved-tensor hooks on the blocks' LayerNorms) within 5 % of Korthikanti's
    LayerNorm term, and 1/t of what plain TP keeps."""
    on, off = _run(1, 1, tp, sp=True), _run(1, 1, tp, sp=False)
    for r in (on, off):
        got = r.metrics["ln_activation_bytes_per_rank"]
        want = r.metrics["predicted_ln_activation_bytes_per_rank"]
        assert all(abs(g - w) <= 0.05 * w for g, w in zip(got, want)), (got, want)
    assert on.metrics["ln_activation_bytes_per_rank"][0] * tp == \
        off.metrics["ln_activation_bytes_per_rank"][0]


def test_sequence_parallel_is_refused_without_a_tensor_axis():
    with pytest.raises(labkit.ConfigError, match="sequence_parallel"):
        labkit.run(strategy="hybrid", model=GPT, world_size=2, steps=1, progress=False,
                   options={"dp": 2, "tp": 1, "sequence_parallel": True})
