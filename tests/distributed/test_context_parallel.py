"""Context parallelism on the rank grid: the GPT's sequence split over a ``cp`` axis with
ring attention (zig-zag chunks) equals one process, alone and beside data, tensor (with
sequence parallelism) and pipeline axes, and every axis's traced bytes equal
``labkit.theory.parallel_layout``'s prediction exactly.

A tiny GPT (width 32, 2 blocks, 16 tokens) keeps the 4-rank runs to seconds on 2 cores.
"""

from __future__ import annotations

import subprocess
import sys
from functools import cache

import pytest

import labkit
from labkit.base.events import Lane, Op

pytestmark = [pytest.mark.distributed, pytest.mark.lesson14]
GPT = {"kind": "gpt", "width": 32, "depth": 2, "heads": 4, "seq_len": 16}
TOL = 1e-5


@cache
def _run(dp: int, pp: int, cp: int, tp: int, zero: int = 0, sp: bool = False
         ) -> labkit.RunResult:
    return labkit.run(strategy="hybrid", model=GPT, steps=2, batch_size=8,
                      check_reference=True, progress=False,
                      options={"dp": dp, "pp": pp, "cp": cp, "tp": tp, "microbatches": 2,
                               "zero_stage": zero, "sequence_parallel": sp})


@pytest.mark.parametrize(("dp", "pp", "cp", "tp", "zero", "sp"), [
    (1, 1, 2, 1, 0, False), (1, 1, 4, 1, 0, False), (1, 1, 2, 2, 0, True),
    (2, 1, 2, 1, 1, False), (1, 2, 2, 1, 0, False)])
def test_context_parallel_equals_one_process_and_every_axis_is_predicted(dp, pp, cp, tp, zero,
                                                                         sp):
    r = _run(dp, pp, cp, tp, zero, sp)
    m = r.metrics
    assert r.config.world_size == dp * pp * cp * tp
    assert m["max_abs_diff_vs_reference"] <= TOL, m["max_abs_diff_vs_reference"]
    got, want = m["comm_bytes_per_axis"], m["predicted_comm_bytes_per_axis"]
    assert got == want
    for axis, size in (("dp", dp), ("pp", pp), ("cp", cp), ("tp", tp)):
        assert (got[axis] > 0) == (size > 1), (axis, got)


def test_the_ring_passes_kv_blocks_on_the_cp_axis_with_zigzag_neighbours():
    """Every ring message is a span on the cp axis, to the next rank of the cp group
    (global stride tp), forward K/V and backward K/V and dK/dV."""
    r = _run(1, 1, 2, 2, sp=True)
    sends = [e for e in r.timeline if e.lane == Lane.COMM and e.op == Op.SEND]
    assert sends and all(e.axis == "cp" for e in sends)
    assert {e.name for e in sends} == {"kv", "kv bwd", "dkv bwd"}
    assert all(abs(e.peer - e.rank) == 2 for e in sends)  # cp neighbours sit tp apart
    assert r.timeline.meta["grid"] == {"dp": 1, "pp": 1, "tp": 2, "cp": 2}


def test_cp_is_checked_before_any_process_starts():
    with pytest.raises(labkit.ConfigError, match=r"multiple of 2 x cp"):
        labkit.run(strategy="hybrid", model={**GPT, "seq_len": 12}, steps=1, progress=False,
                   options={"cp": 4})
    out = subprocess.run([sys.executable, "-m", "labkit", "run", "hybrid", "--cp", "2",
                          "--model", "mlp", "--steps", "1"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0 and "cp (2) needs --model gpt" in out.stderr + out.stdout
