"""The library stays lint-clean (ruff) and type-checked (mypy), as part of the test suite."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _has(module: str) -> bool:
    return subprocess.run([sys.executable, "-c", f"import {module}"],
                          capture_output=True).returncode == 0


@pytest.mark.skipif(not _has("ruff"), reason="ruff is not installed (pip install -e '.[dev]')")
def test_ruff_is_clean():
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "labkit", "tests", "bench",
                          "nbgrader_config.py"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout[-3000:]


@pytest.mark.skipif(not _has("mypy"), reason="mypy is not installed (pip install -e '.[dev]')")
def test_mypy_is_clean(tmp_path):
    cache = tmp_path / "mypy_cache"
    out = subprocess.run([sys.executable, "-m", "mypy", "labkit", "--cache-dir", str(cache)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:]
    shutil.rmtree(cache, ignore_errors=True)
