"""``labkit doctor --selftest --json`` run for real on this machine's CPU (gloo, 2 ranks).

The command an instructor runs first on a new server must come back whole: one row per
check, a verdict on each, the rows that count bytes and weights passing (they do not depend
on the load), the GPU rows saying "skipped: no GPU" and why, an exit code that says whether a
row failed, and no rank left behind. Rows that time things (bubble, overlap, bus bandwidth,
MFU) may fail on a machine busy with other tests; they must still carry their numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from labkit.base import devices

pytestmark = [pytest.mark.distributed, pytest.mark.lesson00]
ROOT = Path(__file__).resolve().parents[2]

COUNTED = ("ranks", "ddp_reference", "tp_bytes", "zero_1_bytes", "zero_2_bytes", "zero_3_bytes",
           "zero_2_bf16_bytes")
"""Rows decided by counts and weights, not by timing: they pass whatever the load."""
TIMED = ("ring_busbw", "bucketed_overlap", "bubble_gpipe", "bubble_1f1b", "mfu")
GPU_ONLY = ("topology", "zero_1_gpu_memory", "zero_2_gpu_memory", "zero_3_gpu_memory",
            "zero_2_bf16_gpu_memory", "datasheet_fp32", "datasheet_bf16", "cuda_events", "gpt_mfu_bf16")


def test_selftest_json_reports_every_lesson_row_on_the_cpu(contained: Any) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "labkit", "doctor", "--selftest", "--json"],
                          capture_output=True, text=True, timeout=400, env=env, cwd=ROOT,
                          check=False)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    rows = {r["key"]: r for r in report["rows"]}
    assert set(rows) == {"cpu_topology", *COUNTED, *TIMED, *GPU_ONLY}, sorted(rows)
    assert proc.returncode == (0 if report["ok"] else 1)
    assert report["ok"] == all(r["status"] != "fail" for r in rows.values())
    assert report["machine"]["backend"] == ("nccl" if devices.gpu_count() >= 2 else "gloo")
    for key in COUNTED:
        assert rows[key]["status"] == "pass", rows[key]
    for key in TIMED:
        assert rows[key]["measured"] and rows[key]["values"], rows[key]
    for row in rows.values():
        assert row["status"] in ("pass", "fail", "skipped")
        assert row["status"] == "pass" or row["note"], f"{row['key']} must say why"
    if devices.gpu_count() == 0:
        for key in GPU_ONLY:
            assert rows[key]["status"] == "skipped", rows[key]
            assert rows[key]["verdict"].startswith("skipped: no GPU: ")
    assert rows["ranks"]["values"]["reports"][0]["device"] in ("cpu", "cuda:0")
    for line in ("ranks start", "ZeRO-3 bytes per rank"):  # progress went to stderr
        assert line in proc.stderr


def _set_meta_default(ctx: Any) -> str:
    import torch

    torch.set_default_device("meta")
    return str(torch.empty(1).device)


def _default_device(ctx: Any) -> str:
    import torch

    return str(torch.empty(1).device)


def test_a_warm_rank_starts_each_job_on_the_default_device(contained: Any) -> None:
    """ZeRO and TP make their GPU torch's default device; on the self-test's NCCL pool the
    next job (DDP, MFU) must not inherit it. Shown here with the meta device on CPU ranks."""
    import labkit

    with labkit.Pool(2) as pool:
        assert pool.launch(_set_meta_default).results == ["meta", "meta"]
        assert pool.launch(_default_device).results == ["cpu", "cpu"]
