"""The peak behind MFU (issue 25, item 1), without timing anything real: which shapes are
measured, how a busy machine is told apart, how the cache is keyed and merged, and that a
model faster than its peak triggers a recalibration instead of an MFU above 1."""

from __future__ import annotations

import io
import json
import sys
import time
import warnings
from typing import Any

import pytest

from labkit.analysis import calibrate as cal
from labkit.analysis import throughput as tp
from labkit.config.run import ModelConfig, RunConfig

pytestmark = pytest.mark.lesson09


def _measured(rates: dict[str, float], others: float = 0.0, spread: float = 0.0,
              threads: int = 2) -> dict[str, Any]:
    return {"rates": rates, "spreads": {k: spread for k in rates}, "others_cores": others,
            "load": 0.1, "device": "cpu", "name": "test cpu", "threads": threads,
            "dtype": "float32", "measured_at": time.time()}


class _Asked(list):  # type: ignore[type-arg]
    """The shapes each measurement was asked for, and (``known``) the peak it was told."""

    def __init__(self) -> None:
        super().__init__()
        self.known: list[float] = []


@pytest.fixture
def fake_machine(tmp_path, monkeypatch):
    """A private cache and a measurement that returns what the test queues (no torch)."""
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path))
    queue: list[dict[str, Any]] = []
    asked = _Asked()

    def run(device, threads, shapes, timeout_s, dtype="fp32", on_shape=None, known_rate=0.0):
        asked.append(list(shapes))
        asked.known.append(known_rate)
        for m, k, n in shapes:  # what the measuring process says as it goes
            if on_shape is not None:
                on_shape(f"{m}x{k}x{n}")
        out = queue.pop(0)
        spread = next(iter(out["spreads"].values()), 0.0)
        skipped = out.get("skipped", {})
        names = [f"{m}x{k}x{n}" for m, k, n in shapes if f"{m}x{k}x{n}" not in skipped]
        return {**out, "rates": {s: out["rates"].get(s, 1e9) for s in names},
                "spreads": {s: spread for s in names}}

    monkeypatch.setattr(cal, "_run_measurement", run)
    monkeypatch.setattr(cal.time, "sleep", lambda s: None)
    monkeypatch.setattr(cal.os, "getloadavg", lambda: (5.0, 5.0, 5.0))
    return queue, asked


def test_the_peak_is_the_best_shape_not_a_1024_matmul(fake_machine) -> None:
    """The issue's machine: 54 GFLOP/s at 1024, 124 at 3072: the peak is 124."""
    queue, asked = fake_machine
    queue.append(_measured({"1024x1024x1024": 54e9, "2048x2048x2048": 85e9,
                            "3072x3072x3072": 124e9}))
    peak = cal.calibrate("cpu", threads=2, shapes=[(64, 128, 384)])
    assert peak is not None and peak["peak_flops_per_s"] == 124e9
    assert peak["shape"] == "3072x3072x3072" and not peak["busy"]
    assert (64, 128, 384) in asked[0] and (3072, 3072, 3072) in asked[0]


def test_a_new_model_measures_only_its_new_shapes(fake_machine) -> None:
    queue, asked = fake_machine
    queue += [_measured({}), _measured({})]
    cal.calibrate("cpu", threads=2, shapes=[(64, 128, 384)])
    cal.calibrate("cpu", threads=2, shapes=[(64, 128, 384), (32, 16, 16)])
    assert asked[1] == [(32, 16, 16)]
    assert cal.calibrate("cpu", threads=2, shapes=[(32, 16, 16)]).get("fresh") is None


def test_a_busy_calibration_is_retried_then_refused_and_never_lowers_the_peak(fake_machine):
    """labkit calibrate under load: three tries, each busy; the cached quiet peak stays."""
    queue, asked = fake_machine
    queue.append(_measured({"3072x3072x3072": 110e9}))
    cal.calibrate("cpu", threads=2)
    queue += [_measured({"3072x3072x3072": 54e9}, others=1.6)] * cal.TRIES
    again = cal.calibrate("cpu", threads=2, refresh=True, tries=cal.TRIES)
    assert len(asked) == 1 + cal.TRIES
    assert again is not None and "other processes used 1.6 of 2 cores" in again["now_busy"]
    assert again["peak_flops_per_s"] == 110e9 and not again["busy"]


def test_noisy_repeats_count_as_busy() -> None:
    assert cal.busy_reason(0.0, 0.5, 2) is not None and "differed by 50%" in \
        cal.busy_reason(0.0, 0.5, 2)
    assert cal.busy_reason(0.1, 0.05, 2) is None
    assert cal.busy_reason(0.4, 0.05, 2) is not None


def test_another_checkout_or_thread_count_has_its_own_key(monkeypatch) -> None:
    key = cal._key("cpu", 2)
    assert cal._key("cpu", 1) != key and cal._key("cuda", 2) != key
    assert "labkit " in key and "torch " in key and "@" in key  # torch version @ its path
    monkeypatch.setattr(cal, "_torch_build", lambda: "2.13.0@/elsewhere/torch#1")
    assert cal._key("cpu", 2) != key


def test_gpt_gemm_shapes_are_the_ranks_own_matmuls() -> None:
    cfg = RunConfig(strategy="ddp", world_size=2, batch_size=8,
                    model=ModelConfig(kind="gpt", width=64, depth=2, heads=4, seq_len=32))
    shapes = tp.gemm_shapes(cfg, 2)
    rows = 8 // 2 * 32
    assert (rows, 64, 192) in shapes and (rows, 256, 64) in shapes  # qkv forward, MLP down
    assert (64, rows, 192) in shapes  # the qkv weight gradient


def test_a_model_faster_than_its_peak_recalibrates_and_never_reports_mfu_above_1(
        monkeypatch) -> None:
    calls: list[bool] = []
    peaks = iter([{"peak_flops_per_s": 54e9, "rates": {"a": 54e9}, "busy": "load 7"},
                  {"peak_flops_per_s": 120e9, "rates": {"a": 120e9}, "fresh": True}])

    def fake_peak(backend, world_size, threads, shapes, refresh=False, dtype="fp32",
                  progress=None):
        calls.append(refresh)
        return next(peaks)

    monkeypatch.setattr(tp, "machine_peak", fake_peak)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new peak explains the run: nothing to warn of
        out = tp.mfu_fields(59e9, "gloo", 2, 1, [])
    assert calls == [False, True]
    assert out["mfu"] == pytest.approx(59 / 120) and out["peak_flops_per_s"] == 120e9
    assert "measured again" in out["peak_source"] and "peak_age_s" in out


def test_the_models_own_shapes_are_measured_only_when_it_beat_the_squares(monkeypatch) -> None:
    """Every new batch size or width has new GEMM shapes: a run below the squares' cached
    peak asks for no shape of its own (no calibration), one above it asks for its shapes
    (not a whole new measurement) before anything is measured again."""
    asked: list[tuple[list[Any], bool]] = []
    rates = {"squares": 100e9, "own": 130e9}

    def fake_peak(backend, world_size, threads, shapes, refresh=False, dtype="fp32",
                  progress=None):
        asked.append((list(shapes), refresh))
        best = rates["own"] if shapes else rates["squares"]
        return {"peak_flops_per_s": best, "rates": {"x": best}}

    monkeypatch.setattr(tp, "machine_peak", fake_peak)
    model = [(64, 128, 384)]
    slow = tp.mfu_fields(60e9, "gloo", 2, 1, model)
    assert asked == [([], False)] and slow["mfu"] == pytest.approx(0.6)
    asked.clear()
    fast = tp.mfu_fields(120e9, "gloo", 2, 1, model)  # a skinny shape beat the squares
    assert asked == [([], False), (model, False)]
    assert fast["mfu"] == pytest.approx(120 / 130) and "measured again" not in fast["peak_source"]


@pytest.mark.parametrize("world, threads, measured_at, times", [
    (2, 1, 1, 2),  # two 1-thread ranks on 2 cores: one thread's peak, twice
    (4, 1, 1, 2),  # four on 2 cores: two run at once
    (1, 2, 2, 1),  # one rank on both cores
    (2, 2, 2, 1),  # two 2-thread ranks on 2 cores take turns
])
def test_a_cpu_peak_is_one_ranks_times_the_ranks_the_cores_hold(monkeypatch, world, threads,
                                                                 measured_at, times) -> None:
    """One rank's matmul rate at its own threads, times the ranks that run at once: bf16 on an
    AVX2 CPU runs one thread whatever it is given, so one process with every rank's threads
    measured one core's rate, which two ranks then beat on every run."""
    from labkit.analysis import calibrate as cal_module

    asked: list[int] = []

    def fake_calibrate(device, threads=None, **kw):
        asked.append(threads)
        return {"peak_flops_per_s": 10e9, "rates": {"x": 10e9}, "threads": threads}

    monkeypatch.setattr(cal_module, "calibrate", fake_calibrate)
    monkeypatch.setattr(tp.devices, "cpu_count", lambda: 2)
    peak = tp.machine_peak("gloo", world, threads, [], dtype="bf16")
    assert asked == [measured_at] and peak is not None
    assert peak["peak_flops_per_s"] == times * 10e9 and peak["processes"] == times
    fields = tp._peak_fields(peak, "src")
    assert fields["peak_threads"] == measured_at and fields["peak_processes"] == times


def test_a_model_faster_than_even_a_new_peak_gets_no_mfu(monkeypatch) -> None:
    monkeypatch.setattr(tp, "machine_peak", lambda *a, **k: {"peak_flops_per_s": 50e9,
                                                             "rates": {"a": 50e9}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a red box about an MFU most runs never print: none
        out = tp.mfu_fields(59e9, "gloo", 2, 1, [])
    assert "mfu" not in out and "too busy" in out["mfu_note"]
    assert "above the cached peak 50.0 and above even the peak measured again (50.0)" \
        in out["mfu_note"]


def test_a_bf16_peak_is_its_own_entry_and_never_feeds_the_fp32_one(fake_machine):
    """--precision bf16 runs divide by the bf16 matmul peak (a GPU's tensor-core rate is 15x
    its fp32 one): it is measured with dtype bf16 and cached under its own key."""
    queue, asked = fake_machine
    queue.append(_measured({"2048x2048x2048": 9e11}))
    queue.append(_measured({"2048x2048x2048": 5e10}))
    bf16 = cal.calibrate("cpu", threads=2, shapes=[(2048, 2048, 2048)], dtype="bf16")
    fp32 = cal.calibrate("cpu", threads=2, shapes=[(2048, 2048, 2048)])
    assert bf16["peak_flops_per_s"] == 9e11 and fp32["peak_flops_per_s"] == 5e10
    assert len(asked) == 2  # two keys, two measurements
    with pytest.raises(ValueError, match="dtype 'fp16' must be one of fp32, bf16"):
        cal.calibrate("cpu", dtype="fp16")


def test_a_shape_whose_one_matmul_would_take_too_long_is_left_out() -> None:
    """Smallest first; a shape is left out when one matmul of it would outlast the limit at
    the best rate measured before it (a real, tiny measurement: the limit makes it so)."""
    out = cal.measure("cpu", 1, [(64, 64, 64), (8, 8, 8)], rounds=1, seconds=0.001,
                      max_call_s=1e-12)
    assert list(out["rates"]) == ["8x8x8"]  # the smallest is measured: no rate to judge by
    est = out["skipped"]["64x64x64"]
    assert est == pytest.approx(2 * 64 ** 3 / out["rates"]["8x8x8"])
    known = cal.measure("cpu", 1, [(8, 8, 8), (16, 16, 16)], rounds=1, seconds=0.001,
                        known_rate=1.0, max_call_s=1e-3)  # 1 FLOP/s: every call too long
    assert known["rates"] == {} and set(known["skipped"]) == {"8x8x8", "16x16x16"}


def test_a_left_out_shape_is_cached_as_such_and_not_measured_at_every_run(fake_machine):
    """The CPU without bf16 instructions: 3072-cube bf16 would take a minute a call, so the
    measurement leaves it out; the next bf16 run asks for nothing more, and a new shape is
    measured knowing the cached peak (to leave out what would take too long)."""
    queue, asked = fake_machine
    queue.append({**_measured({"256x256x256": 1.3e9, "512x512x512": 1.2e9}),
                  "skipped": {"2048x2048x2048": 14.0, "3072x3072x3072": 48.0}})
    first = cal.calibrate("cpu", threads=2, dtype="bf16")
    assert first["peak_flops_per_s"] == 1.3e9 and set(first["skipped"]) == \
        {"2048x2048x2048", "3072x3072x3072"}
    assert cal.calibrate("cpu", threads=2, dtype="bf16").get("fresh") is None  # nothing asked
    queue.append(_measured({"32x32x32": 0.5e9}))
    cal.calibrate("cpu", threads=2, dtype="bf16", shapes=[(32, 32, 32)])
    assert asked[1] == [(32, 32, 32)] and asked.known == [0.0, 1.3e9]
    merged = cal.merge(cal._load()[cal._key("cpu", 2, "bf16")],
                       _measured({"2048x2048x2048": 1.1e9}))  # measured later, by refresh
    assert "2048x2048x2048" not in merged["skipped"] and "3072x3072x3072" in merged["skipped"]


# ---- progress (issue 39, item 3): on stderr, never in --json output -----------------------
class _Terminal(io.StringIO):
    """A stderr that says it is a terminal (where a bar can redraw)."""

    def isatty(self) -> bool:
        return True


def test_a_calibration_says_what_it_measures_and_each_busy_try_on_a_terminal(
        fake_machine, monkeypatch) -> None:
    queue, _ = fake_machine
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    queue += [_measured({"3072x3072x3072": 54e9}, others=1.6), _measured({"3072x3072x3072": 9e10})]
    peak = cal.calibrate("cpu", threads=2, tries=cal.TRIES, progress=True)
    shown = terminal.getvalue()
    assert peak is not None and peak["peak_flops_per_s"] == 9e10
    assert "measuring peak fp32 matmul FLOP/s (2 CPU threads)" in shown
    assert "try 1 of 3 ran on a busy machine: other processes used 1.6 of 2 cores" in shown


def test_a_calibration_asked_for_progress_prints_a_line_per_shape_where_no_bar_can_show(
        fake_machine, capsys) -> None:
    queue, _ = fake_machine
    queue.append(_measured({}))
    cal.calibrate("cpu", threads=1, progress=True)
    out, err = capsys.readouterr()
    assert out == ""
    lines = [line for line in err.splitlines() if line.startswith("measuring peak fp32")]
    assert len(lines) == len(cal.SQUARE) and lines[0].endswith(": 1/5 256x256x256")


def test_an_unasked_calibration_off_a_terminal_is_silent(fake_machine, capsys) -> None:
    """A script's or a test's calibration (stderr not a terminal, progress not asked for)."""
    queue, _ = fake_machine
    queue.append(_measured({}))
    cal.calibrate("cpu", threads=1)
    assert capsys.readouterr() == ("", "")


def test_labkit_calibrate_json_prints_only_the_result_on_stdout(fake_machine, capsys) -> None:
    from labkit.cli import main

    queue, _ = fake_machine
    queue.append(_measured({"3072x3072x3072": 9e10}))
    assert main(["calibrate", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["peak_flops_per_s"] == 9e10  # one JSON object, nothing else
    assert "labkit calibrate: timing torch.mm" in err and "3072x3072x3072" in err


def test_the_implicit_calibration_before_an_mfu_follows_the_runs_progress(monkeypatch) -> None:
    """A lesson sweep's runs (progress=False) measure a missing peak silently; a run left at
    progress=None shows the measurement where one can see it."""
    seen: list[bool | None] = []

    def fake_peak(backend, world_size, threads, shapes, refresh=False, dtype="fp32",
                  progress=None):
        seen.append(progress)
        return {"peak_flops_per_s": 1e12, "rates": {"a": 1e12}}

    monkeypatch.setattr(tp, "machine_peak", fake_peak)
    for progress in (False, None):
        cfg = RunConfig(strategy="ddp", world_size=2, batch_size=8, progress=progress)
        tp.throughput({"flops_per_step": 1e9}, 0.1, cfg, "gloo", 1)
    assert seen == [False, None]
