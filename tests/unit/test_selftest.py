"""The self-test's verdicts and its table, on numbers given by hand (no processes).

Every bar is pinned on both sides: a number inside passes, one just outside fails with a
note that says why (a row that cannot fail proves nothing). The ZeRO and bubble checks are
pinned against their papers' own worked numbers, not against labkit's formulas.
"""

from __future__ import annotations

import json

import pytest

from labkit.cli import main
from labkit.config.run import RunConfig
from labkit.selftest import judge
from labkit.selftest.rows import FAIL, PASS, SKIP, Row, SelftestReport, skipped
from labkit.selftest.sizes import Sizes, batch_for, cpu_sizes, gpu_sizes, mlp_weights

pytestmark = [pytest.mark.lesson00]


# ---- the verdicts ------------------------------------------------------------------------
def test_ddp_row_fails_past_the_backend_tolerance():
    """1e-5 on gloo (the lab's DDP tests), 1e-4 on NCCL (other summation order)."""
    assert judge.ddp_equals_one_process("gloo", 1.5e-8, 10).status == PASS
    bad = judge.ddp_equals_one_process("gloo", 2e-5, 10)
    assert bad.status == FAIL and "not averaged" in bad.note
    assert judge.ddp_equals_one_process("nccl", 2e-5, 10).status == PASS


def _bw(size: int, t: float, n: int = 2) -> dict[str, float]:
    return {"time_s": t, "busbw_gbps": size / t * 2 * (n - 1) / n / 1e9}


def test_ring_row_takes_the_median_round_and_checks_the_nccl_tests_definition():
    """ratio >= 0.5 passes; a slower ring fails; a busbw that is not size/time x 2(n-1)/n
    (nccl-tests) fails even when the ratio is fine."""
    size = 4_000_000
    rounds = [(_bw(size, 0.004), _bw(size, 0.003)), (_bw(size, 0.012), _bw(size, 0.003)),
              (_bw(size, 0.003), _bw(size, 0.003))]
    ok = judge.ring_vs_builtin("gloo", size, 2, rounds)
    assert ok.status == PASS and ok.off_by == "ratio 0.75", "the stalled round is outvoted"
    slow = judge.ring_vs_builtin("gloo", size, 2, [(_bw(size, 0.010), _bw(size, 0.003))])
    assert slow.status == FAIL and "30%" in slow.note
    four = judge.ring_vs_builtin("gloo", size, 4, [(_bw(size, 0.004, 4), _bw(size, 0.004, 4))])
    assert four.status == PASS, "n=4: busbw = algbw x 1.5"
    wrong = {"time_s": 0.004, "busbw_gbps": size / 0.004 / 1e9 * 1.5}
    bad = judge.ring_vs_builtin("gloo", size, 2, [(wrong, _bw(size, 0.004))])
    assert bad.status == FAIL and "2(n-1)/n" in bad.note


def test_overlap_row_needs_more_than_timer_jitter():
    assert judge.bucketed_overlap("gloo", 0.27, 15).status == PASS
    none = judge.bucketed_overlap("gloo", 0.0, 15)
    assert none.status == FAIL and "backward" in none.note
    assert judge.bucketed_overlap("gloo", 0.04, 15).status == FAIL


@pytest.mark.parametrize("p, m, want", [(2, 4, 0.2), (4, 8, 3 / 11), (2, 2, 1 / 3)])
def test_bubble_row_uses_gpipes_formula_and_its_tolerance(p, m, want):
    """(p-1)/(m+p-1): p=4, m=8 gives 3/11 (the GPipe paper's share of idle time)."""
    ok = judge.pipeline_bubble("gloo", "1f1b", p, m, want + 0.049, want)
    assert ok.status == PASS and ok.values["predicted"] == pytest.approx(want)
    far = judge.pipeline_bubble("gloo", "1f1b", p, m, want + 0.051, want)
    assert far.status == FAIL and "+0.051" in far.note


def test_bubble_row_fails_when_labkits_formula_disagrees_with_the_paper():
    row = judge.pipeline_bubble("gloo", "gpipe", 2, 4, 0.2, 0.25)
    assert row.status == FAIL and "labkit predicts 0.250" in row.note


@pytest.mark.parametrize("stage, gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_paper_zero_bytes_match_figure_1_of_the_zero_paper(stage, gb):
    """Rajbhandari et al. 2020, fig. 1: Psi = 7.5B, N_d = 64, K = 12 (mixed precision):
    120 / 31.4 / 16.6 / 1.9 GB per device for baseline and stages 1-3."""
    total = sum(judge.paper_zero_bytes(7_500_000_000, 64, stage, "bf16").values())
    assert total / 1e9 == pytest.approx(gb, abs=0.06)


def test_zero_row_fails_when_a_rank_keeps_more_than_its_shard():
    paper = judge.paper_zero_bytes(55050, 2, 2, "fp32")
    exact = [{k: int(v) for k, v in paper.items()}] * 2
    assert judge.zero_bytes("gloo", 2, 55050, 2, "fp32", exact).status == PASS
    whole_grads = [{**exact[0], "grads": int(paper["grads"] * 2)}, exact[1]]
    bad = judge.zero_bytes("gloo", 2, 55050, 2, "fp32", whole_grads)
    assert bad.status == FAIL and bad.values["worst_relative"] == pytest.approx(1.0)


def test_tp_row_wants_megatrons_bytes_exactly():
    """2 pairs (attention + MLP) x b*s*h fp32 values per direction and layer."""
    one = 2 * 32 * 16 * 256 * 4
    layers = [{"forward": one, "backward": one}] * 2
    assert judge.tp_bytes("gloo", 32, 16, 256, 2, layers).status == PASS
    off = [{"forward": one, "backward": one + 4}, layers[1]]
    assert judge.tp_bytes("gloo", 32, 16, 256, 2, off).status == FAIL


def test_mfu_row_fails_above_one_below_the_floor_and_on_a_wrong_flop_count():
    w, batch = mlp_weights(32, 1024, 8), 512
    flops = 6 * w * batch
    assert judge.mfu("gloo", 0.6, flops, w, batch, 170e9, "calibrated").status == PASS
    above = judge.mfu("gloo", 2.07, flops, w, batch, 63e9, "calibrated")
    assert above.status == FAIL and "labkit calibrate" in above.note and "130.4 GFLOP/s" \
        in above.note
    assert judge.mfu("gloo", 0.05, flops, w, batch, 170e9, "c").status == FAIL
    assert "no peak" in judge.mfu("gloo", None, flops, w, batch, None, "c").note
    miscount = judge.mfu("gloo", 0.6, flops * 1.01, w, batch, 170e9, "c")
    assert miscount.status == FAIL and "6 x weights x samples" in miscount.note


# ---- the table -----------------------------------------------------------------------------
def _report() -> SelftestReport:
    rows = [judge.ddp_equals_one_process("gloo", 1e-8, 10),
            judge.bucketed_overlap("gloo", 0.0, 3),
            skipped("datasheet_bf16", "09", "bf16 | peak", "cuda", "no GPU: a CPU build")]
    return SelftestReport(rows=rows, machine={"platform": "test", "cpu_cores": 2, "gpus": [],
                                              "backend": "gloo", "world_size": 2,
                                              "load_before": 0.1, "load_after": 0.2},
                          wall_s=12.0)


def test_report_counts_a_failure_and_says_why_in_every_format():
    rep = _report()
    assert not rep.ok and rep.summary() == "1 passed, 1 failed, 1 skipped in 12 s"
    data = json.loads(json.dumps(rep.to_json()))
    assert data["summary"] == {PASS: 1, FAIL: 1, SKIP: 1} and data["ok"] is False
    assert [r["verdict"].split(":")[0] for r in data["rows"]] == ["pass", "FAIL", "skipped"]
    md = rep.markdown()
    assert "| 09 | bf16 \\| peak |" in md, "pipes in a cell are escaped"
    assert "**FAIL: no all-reduce ran" in md and "skipped: no GPU: a CPU build" in md
    text = str(rep)
    assert "^ no GPU: a CPU build" in text and text.splitlines()[-1] == rep.summary()


def test_a_report_with_only_passes_and_skips_is_ok():
    rep = _report()
    rep.rows = [r for r in rep.rows if r.status != FAIL]
    assert rep.ok


def test_row_verdicts_read_as_the_table_prints_them():
    row = Row(key="k", lesson="01", check="c", backend="gloo", status=FAIL, note="off")
    assert row.verdict == "FAIL: off"
    assert skipped("k", "01", "c", "nccl", "no GPU").verdict == "skipped: no GPU"


# ---- sizes ---------------------------------------------------------------------------------
def test_batch_for_is_a_power_of_two_near_the_target_step():
    peak = 50e12  # an H100's fp32 CUDA-core rate, order of magnitude (a fixture)
    w = mlp_weights(32, 4096, 8)
    b = batch_for(w, peak, 0.05)
    assert b & (b - 1) == 0
    assert 0.025 <= 6 * w * b / peak <= 0.05
    assert batch_for(w, 1e9, 0.05) == 64, "clamped below"
    assert batch_for(1.0, 1e18, 0.05) == 16384, "clamped above"


def _configs(s: Sizes) -> list[RunConfig]:
    return [RunConfig(strategy=name, world_size=2, **run.kwargs()) for name, run in (
        ("ddp", s.ddp), ("ddp-bucketed", s.bucketed), ("pipeline", s.pipeline),
        ("zero", s.zero), ("tp", s.tp), ("ddp", s.mfu))]


@pytest.mark.parametrize("sizes", [cpu_sizes(), gpu_sizes(50e12), gpu_sizes(5e12)],
                         ids=["cpu", "gpu-fast", "gpu-slow"])
def test_every_size_is_a_valid_run(sizes):
    """No ConfigError: the pipeline batch splits into its microbatches, TP's heads divide."""
    assert len(_configs(sizes)) == 6


# ---- the command line ------------------------------------------------------------------------
@pytest.mark.parametrize("argv, says", [
    (["doctor", "--anything"], "doctor does not take '--anything'"),
    (["doctor", "extra"], "doctor does not take 'extra'"),
    (["doctor", "--selftest", "--json", "--markdown"], "pick one"),
    (["doctor", "--markdown"], "add --selftest"),
    (["doctor", "--clean", "--selftest"], "two steps")])
def test_doctor_refuses_what_it_does_not_take_with_exit_2(capsys, argv, says):
    """Issue 25 item 6: `labkit doctor --anything` was accepted silently (exit 0)."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("labkit: error: ") and says in err


def test_a_check_that_raises_becomes_a_fail_row_and_the_table_goes_on():
    """A dead rank or a missing metric is a row naming the error, never a crash."""
    from labkit.selftest.runner import _guarded

    def zero(bench):
        raise KeyError("per_rank_bytes")

    (row,) = _guarded(zero, None)
    assert row.status == FAIL and row.key == "zero" and "KeyError: 'per_rank_bytes'" in row.note
    assert _guarded(lambda bench: [skipped("k", "01", "c", "gloo", "why")], None)[0].status == SKIP


def test_the_bubble_row_judges_the_least_of_its_runs_and_shows_the_spread():
    """The H200's 16 cores read GPipe's bubble at 0.238, 0.254 and 0.256 against 0.200 in
    three single runs: noise only adds idle time, so the least run is judged (0.238 passes)
    and the spread is shown; runs that all miss still fail."""
    from labkit.selftest.judge import pipeline_bubble

    row = pipeline_bubble("gloo", "gpipe", 2, 4, [0.256, 0.238, 0.254], 0.2)
    assert row.status == "pass" and row.values["measured"] == 0.238
    assert row.measured == "0.238 (least of 3; spread 0.018)"
    assert pipeline_bubble("gloo", "gpipe", 2, 4, [0.31, 0.30], 0.2).status == "fail"
    assert pipeline_bubble("gloo", "gpipe", 2, 4, 0.21, 0.2).measured == "0.210"


# ---- progress (issue 39, item 3): a line per check as it starts and ends, never in --json ---
def test_the_selftest_names_each_check_before_it_runs(monkeypatch):
    """`on_start` hears the pool's start, then each check's name before its rows land."""
    from contextlib import nullcontext
    from types import SimpleNamespace

    from labkit.base import devices
    from labkit.selftest import checks, gpu, runner

    heard: list[str] = []

    def check(name):
        def run(*args):
            heard.append(f"ran {name}")
            return [Row(key=name, lesson="01", check=name, backend="gloo", status=PASS)]
        run.__name__ = name
        return run

    monkeypatch.setattr(devices, "gpu_count", lambda: 0)
    pool = SimpleNamespace(backend="gloo", world_size=2)
    monkeypatch.setattr(runner, "Pool", lambda world_size, backend="auto": nullcontext(pool))
    monkeypatch.setattr(checks, "RANK_CHECKS", (check("ddp_reference"), check("ring")))
    monkeypatch.setattr(gpu, "device_rows", check("device_rows"))
    monkeypatch.setattr(gpu, "gpt_mfu", check("gpt_mfu"))
    monkeypatch.setattr(gpu, "topology_row", lambda gpus: check("gpus")()[0])  # no nvidia-smi
    runner.run_selftest(on_start=heard.append, on_row=lambda row: heard.append(f"row {row.key}"))
    start = heard.index("2 ranks on gloo, one warm pool for every check")
    assert heard[start + 1:] == [
        "ddp reference", "ran ddp_reference", "row ddp_reference", "ring", "ran ring", "row ring",
        "device rows", "ran device_rows", "row device_rows", "gpt mfu", "ran gpt_mfu",
        "row gpt_mfu"]


def test_doctor_selftest_json_keeps_progress_on_stderr(capsys, monkeypatch):
    import labkit.selftest as selftest

    def fake(on_row=None, on_start=None):
        row = Row(key="ring", lesson="06", check="our ring", backend="gloo", status=PASS)
        on_start("ring")
        on_row(row)
        return SelftestReport(rows=[row], machine={})

    monkeypatch.setattr(selftest, "run_selftest", fake)
    assert main(["doctor", "--selftest", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["rows"][0]["key"] == "ring"  # stdout: the JSON only
    assert "  ring...\n  06 our ring: pass" in err
