"""Pure logic of lesson 01 (no processes): size parsing, options, buckets, chunking, demos."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from labkit.base.errors import ConfigError
from labkit.config.run import RunConfig
from labkit.lessons.dp_demos import duplicate_report
from labkit.lessons.stale_sgd import stale_sgd_losses
from labkit.strategies.collectives import AllreduceBenchOptions, format_size, parse_size
from labkit.strategies.collectives.bench import alpha_beta_summary, results_table
from labkit.strategies.collectives.ring import chunk_bounds
from labkit.strategies.dp import BucketedOptions
from labkit.strategies.dp.buckets import BucketManager
from labkit.theory import AlphaBeta

pytestmark = pytest.mark.lesson01


def test_parse_size_units_and_errors() -> None:
    """Decimal and binary units parse; bad text, tiny and non-multiple-of-4 sizes are refused."""
    assert parse_size("4KB") == 4000 and parse_size("1MiB") == 2**20
    assert parse_size(4096) == 4096 and parse_size("2.5MB") == 2_500_000
    for bad in ("4XB", "abc", 2, "6", True):
        with pytest.raises(ConfigError, match="e.g."):
            parse_size(bad)
    assert format_size(4000) == "4KB" and format_size(12) == "12B"


def test_bench_options_validate_before_any_process() -> None:
    """Every bad value is named in one ConfigError; good sizes become bytes."""
    opts = AllreduceBenchOptions(impl="ring", sizes=("4KB", 1024))
    assert opts.sizes_bytes == (4000, 1024)
    with pytest.raises(ConfigError) as err:
        AllreduceBenchOptions(impl="tree", sizes=("4QB",), iters=0)
    text = str(err.value)
    assert "tree" in text and "4QB" in text and "iters (0)" in text
    cfg = RunConfig(strategy="allreduce-bench", options={"sizes": ["1MB"]})
    assert cfg.options.sizes_bytes == (1_000_000,)
    with pytest.raises(ConfigError, match="bucket_cap_mb"):
        BucketedOptions(bucket_cap_mb=0)


def test_results_table_uses_nccl_tests_definitions() -> None:
    """algbw = size/time; busbw = algbw x 2(n-1)/n (GB/s = 1e9 bytes/s)."""
    rows = results_table([4_000_000], [0.002], 4)
    assert rows[0]["algbw_gbps"] == pytest.approx(2.0)
    assert rows[0]["busbw_gbps"] == pytest.approx(2.0 * 2 * 3 / 4)
    ab = alpha_beta_summary([1e5, 1e6, 1e7], [1e-4 + 1e-6, 1e-4 + 1e-5, 1e-4 + 1e-4], 2)
    assert ab is not None and ab["predicted_time_s"][2] == pytest.approx(2e-4, rel=1e-6)
    assert alpha_beta_summary([1e6], [1e-3], 2) is None
    assert ab["stall_s"] == 0.0  # no mean calls given: nothing known beyond the line


def test_stall_is_the_mean_calls_excess_over_the_median_line() -> None:
    """Medians on the line t = 1e-4 + x/B; one call in four at each size stalled by 4 ms, so
    each mean sits 1 ms above its median: the stall a call adds on average is 1 ms. The line
    (alpha, bandwidth) is the medians' alone, and a mean under the line counts as no stall."""
    sizes, medians = [1e5, 1e6, 1e7], [1e-4 + 1e-6, 1e-4 + 1e-5, 1e-4 + 1e-4]
    ab = alpha_beta_summary(sizes, medians, 2, [t + 1e-3 for t in medians])
    plain = alpha_beta_summary(sizes, medians, 2)
    assert ab is not None and plain is not None
    assert ab["stall_s"] == pytest.approx(1e-3, rel=1e-6)
    assert (ab["alpha_s"], ab["bandwidth_gbps"]) == (plain["alpha_s"], plain["bandwidth_gbps"])
    under = alpha_beta_summary(sizes, medians, 2, [t * 0.9 for t in medians])
    assert under is not None and under["stall_s"] == 0.0
    fit = AlphaBeta.from_bench(ab)
    assert fit.predict(1e6) == pytest.approx(medians[1], rel=1e-6)  # the medians' line
    assert fit.predict_mean(1e6) == pytest.approx(fit.predict(1e6) + 1e-3)
    assert (fit.world_size, fit.r_squared) == (2, ab["r_squared"])
    line = AlphaBeta.from_bench(ab, stalls=False)  # the wire a dedicated-core replay charges
    assert line.stall_s == 0.0 and line.predict(1e6) == fit.predict(1e6)
    assert AlphaBeta(alpha_s=1e-4, bandwidth_Bps=1e9).predict_mean(1e6) == \
        AlphaBeta(alpha_s=1e-4, bandwidth_Bps=1e9).predict(1e6)  # an assumed link: no stall


def test_chunk_bounds_tile_the_tensor() -> None:
    """Chunks cover [0, numel) once and differ in size by at most one element."""
    for numel in (0, 1, 5, 7, 1001):
        for n in (1, 2, 3, 4):
            b = chunk_bounds(numel, n)
            assert b[0][0] == 0 and b[-1][1] == numel
            assert all(b[i][1] == b[i + 1][0] for i in range(n - 1))
            sizes = [e - s for s, e in b]
            assert max(sizes) - min(sizes) <= 1


class _FakeComm:
    world_size = 2

    def __init__(self) -> None:
        self.launched: list[int] = []

    def all_reduce(self, t: torch.Tensor, **meta: object) -> object:
        self.launched.append(int(meta["bucket"]))  # type: ignore[call-overload]

        class _H:
            def wait(self) -> None:
                t.mul_(2)  # as if the other rank held the same gradient
        return _H()


def test_buckets_fill_in_reverse_order_and_launch_in_index_order() -> None:
    """Last layer in bucket 0; all buckets launch during backward; grads come back averaged."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                        nn.Linear(16, 4))
    named = list(net.named_parameters())
    comm = _FakeComm()
    mgr = BucketManager(named, comm, cap_bytes=16 * 16 * 4 + 1)  # type: ignore[arg-type]
    assert mgr.buckets[0].params[0][0] == "4.bias"
    assert sum(len(b.params) for b in mgr.buckets) == len(named)
    assert all(b.nbytes <= 16 * 16 * 4 + 1 or len(b.params) == 1 for b in mgr.buckets)
    net(torch.randn(3, 8)).sum().backward()
    local = [p.grad.clone() for _, p in named]  # type: ignore[union-attr]
    assert comm.launched == list(range(len(mgr.buckets)))
    mgr.wait_all()
    for (name, p), g in zip(named, local):
        assert torch.equal(p.grad, g), f"{name}: (2 x grad) / world_size must equal grad"


def test_duplicate_report_counts_shared_samples() -> None:
    """Two ranks with the same ids: half of what was loaded is duplicated."""
    same = [{"rank": r, "epochs": [[0, 1, 2, 3], [0, 1, 2, 3]]} for r in range(2)]
    rep = duplicate_report(same)
    assert rep["duplicate_fraction"] == [0.5, 0.5] and rep["epoch_repeats_first"] == [True]


def test_stale_gradients_slow_training_in_the_simulation() -> None:
    """SIMULATION: gradients 8 steps old end at a higher loss than synchronous SGD."""
    losses = stale_sgd_losses([0, 8], steps=30)
    assert losses[0][0] == losses[8][0]
    assert losses[8][-1] > losses[0][-1]
