"""The three DDP variants train exactly like one process on the global batch, and the
bucketed one launches its all-reduces during backward (the overlap), the naive one after.

Also: the benchmark's JSON contract, and the common-mistake demos on real ranks.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from labkit.api import launch, run
from labkit.base.events import Op
from labkit.config.run import ModelConfig
from labkit.launchers.results import RunResult
from labkit.lessons.dp_demos import all_mistakes, duplicate_report

pytestmark = [pytest.mark.distributed, pytest.mark.lesson01]

MODEL = ModelConfig(width=128, depth=4)


def _run(strategy: str, options: dict | None = None) -> RunResult:
    return run(strategy=strategy, world_size=2, steps=10, options=options,
                      model=MODEL, check_reference=True, timeout_s=120, progress=False)


@pytest.mark.parametrize("strategy,options", [("ddp-naive", None),
                                              ("ddp-bucketed", {"bucket_cap_mb": 0.05}),
                                              ("ddp", {"bucket_cap_mb": 0.05})])
def test_variant_matches_single_process_reference(strategy: str, options: dict | None) -> None:
    """After 10 steps the weights equal the single-process run (max abs diff <= 1e-5)."""
    r = _run(strategy, options)
    m = r.metrics
    diff = m["max_abs_diff_vs_reference"]
    assert diff <= 1e-5, f"{strategy}: rank 0 weights differ from the reference by {diff:.3g}"
    assert m["bytes_per_step"] == 4 * m["num_params"]
    for key in ("compute_s", "comm_s", "overlap_fraction", "buckets"):
        assert key in m, f"{strategy}: metrics lack {key}"
    if strategy == "ddp-naive":
        assert m["buckets"] == 2 * (MODEL.depth + 1)
        _assert_comm_after_backward(r)
        assert m["overlap_fraction"] == 0.0
    if strategy == "ddp-bucketed":
        assert m["buckets"] > 1 and sum(m["bucket_bytes"]) == m["bytes_per_step"]
        # bucket 0 holds the LAST layer: buckets are filled in reverse parameter order
        assert m["bucket_params"][0][0] == f"{2 * MODEL.depth}.bias"
        _assert_comm_inside_backward(r)
        assert m["overlap_fraction"] > 0
        recs = [o.extra["train_step"] for o in r.outputs]
        assert recs[0]["grad_norms_local"] != recs[1]["grad_norms_local"], \
            "local gradients should differ between ranks (different shards)"
        assert recs[0]["grad_norms_synced"] == pytest.approx(recs[1]["grad_norms_synced"],
                                                             rel=1e-6)


def _backward_end(r: RunResult, rank: int, step: int) -> int:
    return max(e.end_ns for e in r.timeline.select(rank=rank, op=Op.BACKWARD, step=step))


def _assert_comm_after_backward(r: RunResult) -> None:
    for rank in range(2):
        for step in range(10):
            end = _backward_end(r, rank, step)
            for e in r.timeline.select(rank=rank, op=Op.ALL_REDUCE, step=step):
                assert e.start_ns >= end, f"rank {rank} step {step}: {e.name} before backward end"


def _assert_comm_inside_backward(r: RunResult) -> None:
    for rank in range(2):
        for step in range(10):
            end = _backward_end(r, rank, step)
            starts = [e.start_ns for e in r.timeline.select(rank=rank, op=Op.ALL_REDUCE, step=step)]
            assert min(starts) < end, f"rank {rank} step {step}: no bucket launched in backward"


def test_allreduce_bench_cli_json_contract() -> None:
    """`labkit run allreduce-bench --impl ring --sizes ... --json`: results and alpha_beta."""
    cmd = [sys.executable, "-m", "labkit", "run", "allreduce-bench", "--impl", "ring",
           "--sizes", "4KB", "64KB", "256KB", "--iters", "3", "--warmup", "1", "--json",
           "--world-size", "2", "--timeout", "90"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    m = json.loads(proc.stdout)["metrics"]
    assert [row["bytes"] for row in m["results"]] == [4000, 64000, 256000]
    for row in m["results"]:
        assert set(row) >= {"bytes", "time_s", "algbw_gbps", "busbw_gbps"}
        assert row["algbw_gbps"] == pytest.approx(row["bytes"] / row["time_s"] / 1e9)
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * 1 / 2)
        assert 0 < row["fastest_s"] <= row["time_s"]  # the fastest call, never above the median
        assert row["mean_s"] >= row["fastest_s"]  # the mean call, never below the fastest
    for ab in (m["alpha_beta"], m["alpha_beta_fastest"]):  # the fastest calls' line too
        if ab is not None:  # None only if noise made the times not grow with size
            assert len(ab["predicted_time_s"]) == 3 and ab["bandwidth_gbps"] > 0
            assert ab["stall_s"] >= 0


def test_common_mistakes_show_up_in_real_runs() -> None:
    """No DistributedSampler: both ranks load every sample; no set_epoch: epochs repeat;
    BatchNorm on local batches drifts from the global-batch reference; LayerNorm, GroupNorm
    and SyncBatchNorm (statistics all-reduced, 2C+1 values forward and 2C backward) do not."""
    res = launch(all_mistakes, 2, timeout_s=90).results
    bad, no_epoch, good = (duplicate_report([r[k] for r in res])
                           for k in ("no_sampler", "no_set_epoch", "correct"))
    assert bad["duplicate_fraction"] == [0.5, 0.5] and bad["loaded_per_epoch"] == [32, 32]
    assert no_epoch["duplicate_fraction"] == [0.0, 0.0]
    assert no_epoch["epoch_repeats_first"] == [True]
    assert good["epoch_repeats_first"] == [False]
    bn0, bn1 = res[0]["batchnorm"], res[1]["batchnorm"]
    assert bn0["max_abs_diff_vs_reference"] > 1e-3, "local BatchNorm should drift"
    assert bn0["running_mean"] != bn1["running_mean"], "running stats should differ per rank"
    assert res[0]["layernorm"]["max_abs_diff_vs_reference"] <= 1e-5
    # SyncBatchNorm through the traced comm layer IS BatchNorm on the global batch
    sync0, sync1 = res[0]["syncbatchnorm"], res[1]["syncbatchnorm"]
    assert sync0["max_abs_diff_vs_reference"] <= 1e-5
    assert sync0["running_mean"] == sync1["running_mean"], "one set of statistics"
    assert sync0["syncbn_bytes_per_step"] == (2 * 64 + 1) * 4 + 2 * 64 * 4  # fwd + bwd sums
    assert res[0]["groupnorm"]["max_abs_diff_vs_reference"] <= 1e-5
