"""labkit.theory.cli: the `labkit calc` subcommands, driven through a bare argparse harness."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.theory.cli import register

REPO = Path(__file__).resolve().parents[2]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Parse ``argv`` with a parser that only knows ``calc``; return (exit code, out, err)."""
    parser = argparse.ArgumentParser(prog="labkit")
    register(parser.add_subparsers())
    try:
        args = parser.parse_args(argv)
        code = args.func(args)
    except SystemExit as stop:  # argparse's own errors (bad type, bad choice)
        code = int(stop.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_memory_table_reproduces_zero_stage_1(capsys: pytest.CaptureFixture[str]) -> None:
    """7.5e9 params, dp 64, ZeRO-1: 31.41 GB (29.25 GiB) per rank, with every term listed."""
    code, out, err = run(["calc", "memory", "--params", "7.5e9", "--dp", "64",
                          "--zero-stage", "1"], capsys)
    assert code == 0 and err == ""
    total = next(line for line in out.splitlines() if line.startswith("total"))
    assert "31.41" in total and "29.25" in total
    for term in ("params", "grads", "optimizer"):
        assert term in out


def test_memory_json_is_one_object_with_bytes_per_rank(
        capsys: pytest.CaptureFixture[str]) -> None:
    """--json prints the documented keys; stage 3 on 64 ranks is 1.875e9 bytes."""
    code, out, _ = run(["calc", "memory", "--params", "7.5e9", "--dp", "64", "--zero-stage",
                        "3", "--precision", "mixed", "--optimizer", "adam", "--json"], capsys)
    data = json.loads(out)
    assert code == 0
    assert set(data) == {"params", "dp", "stage", "precision", "optimizer", "bytes_per_rank"}
    assert (data["dp"], data["stage"], data["precision"], data["optimizer"]) == \
        (64, 3, "mixed", "adam")
    assert set(data["bytes_per_rank"]) == {"params", "grads", "optimizer", "total"}
    assert data["bytes_per_rank"]["total"] == pytest.approx(1.875e9)


def test_lr_prints_the_seed_expected_output(capsys: pytest.CaptureFixture[str]) -> None:
    """Seed 000's expected output, character for character."""
    code, out, _ = run(["calc", "lr", "--per-device-batch", "32", "--devices", "8",
                        "--accumulation", "4", "--base-lr", "0.001", "--base-batch", "256",
                        "--warmup-steps", "500", "--step", "250"], capsys)
    assert code == 0
    assert out.strip() == "Global batch: 1024; Target LR: 0.004; LR at step 250: 0.002"


def test_lr_without_step_or_base_batch(capsys: pytest.CaptureFixture[str]) -> None:
    """Without --base-batch there is no scaling; without --step no per-step LR."""
    code, out, _ = run(["calc", "lr", "--per-device-batch", "32", "--devices", "8",
                        "--base-lr", "0.001", "--json"], capsys)
    assert code == 0
    assert json.loads(out) == {"global_batch": 256, "target_lr": 0.001}


def test_bubble_shows_both_conventions(capsys: pytest.CaptureFixture[str]) -> None:
    """p=4, m=8: 3/11 of the step (27.3%) and 3/8 of ideal compute (37.5%)."""
    code, out, _ = run(["calc", "bubble", "--stages", "4", "--microbatches", "8"], capsys)
    assert code == 0
    assert "27.3%" in out and "37.5%" in out and "3/(8+3)" in out
    code, out, _ = run(["calc", "bubble", "--stages", "4", "--microbatches", "8",
                        "--schedule", "interleaved", "--virtual", "2", "--json"], capsys)
    data = json.loads(out)
    assert data["bubble_total"] == pytest.approx(3 / 19)
    assert data["bubble_ideal"] == pytest.approx(3 / 16)


def test_allreduce_reports_ring_bytes_and_time(capsys: pytest.CaptureFixture[str]) -> None:
    """100 MB on 8 ranks: each sends 175 MB; time follows the link's alpha-beta model."""
    code, out, _ = run(["calc", "allreduce", "--size-mb", "100", "--world-size", "8",
                        "--link", "pcie4", "--json"], capsys)
    data = json.loads(out)
    assert code == 0
    assert data["ring_bytes_per_rank"] == pytest.approx(175e6)
    assert data["naive_root_bytes"] == pytest.approx(700e6)
    assert data["time_s"] == pytest.approx(14 * 3e-6 + 175e6 / 31.5e9)
    code, out, _ = run(["calc", "allreduce", "--size-mb", "100", "--world-size", "8",
                        "--alpha-us", "0", "--bandwidth-gbs", "10"], capsys)
    assert code == 0 and "17.500 ms" in out


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["calc", "memory", "--params", "7.5e9", "--dp", "64", "--zero-stage", "4"],
         "stage (4)"),
        (["calc", "memory", "--params", "7.5e9", "--dp", "0"], "dp (0)"),
        (["calc", "bubble", "--stages", "4", "--microbatches", "8", "--virtual", "2"],
         "virtual (2)"),
        (["calc", "lr", "--per-device-batch", "0", "--devices", "8", "--base-lr", "0.1"],
         "per_device_batch (0)"),
        (["calc", "allreduce", "--size-mb", "100", "--world-size", "0"], "world_size (0)"),
        (["calc", "allreduce", "--size-mb", "-5", "--world-size", "2"], "--size-mb (-5)"),
        (["calc", "memory", "--params", "7.5e9", "--precision", "bf16"], "'bf16'"),
        (["calc", "allreduce", "--size-mb", "1", "--world-size", "2", "--link", "x"], "'x'"),
        (["calc", "bubble", "--stages", "four", "--microbatches", "8"], "'four'"),
    ],
)
def test_bad_input_exits_2_with_the_value_on_stderr(
        argv: list[str], names: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Bad values: exit code 2, nothing on stdout, a message naming the value on stderr."""
    code, out, err = run(argv, capsys)
    assert code == 2
    assert out == ""
    assert names in err


def test_importing_theory_does_not_import_torch() -> None:
    """The calculators must stay instant to import: labkit.theory pulls in no torch or
    numpy of its own (whatever the parent package may import is measured out)."""
    code = ("import sys, labkit; before = set(sys.modules); "
            "import labkit.theory, labkit.theory.cli; "
            "bad = sorted(m for m in set(sys.modules) - before "
            "if m.split('.')[0] in ('torch', 'numpy')); "
            "sys.exit(f'imported {bad}' if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
