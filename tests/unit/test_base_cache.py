"""The keyed JSON cache of this machine's measurements (``labkit.base.cache.KeyedCache``):
entries kept by key beside each other, a broken file read as empty, the lock shared by the
processes that measure, and an unwritable cache a warning, never an error. Calibrate's peak
and the planner's step cost both use it."""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path

import pytest

from labkit.analysis import calibrate
from labkit.base.cache import KeyedCache
from labkit.theory import plan_local


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> KeyedCache:
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path))
    return KeyedCache("things", label="test", what="the thing")


def test_entries_are_kept_by_key_beside_each_other(cache: KeyedCache, tmp_path: Path) -> None:
    assert cache.load() == {} and cache.get("a") is None
    with cache.locked() as writable:
        assert writable
        assert cache.put("a", {"x": 1}) and cache.put("b", {"y": [2, 3]})
    assert cache.get("a") == {"x": 1} and cache.get("b") == {"y": [2, 3]}
    assert json.loads((tmp_path / "things.json").read_text()) == {"a": {"x": 1},
                                                                   "b": {"y": [2, 3]}}
    cache.put("a", {"x": 4})
    assert cache.load() == {"a": {"x": 4}, "b": {"y": [2, 3]}}


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"a": 3}'])
def test_a_broken_file_or_entry_reads_as_missing(cache: KeyedCache, tmp_path: Path,
                                                 text: str) -> None:
    (tmp_path / "things.json").write_text(text)
    assert cache.get("a") is None
    cache.put("b", {"z": 1})  # the broken file is replaced, not an error
    assert cache.get("b") == {"z": 1}


def test_an_unusable_cache_directory_warns_and_keeps_nothing(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    monkeypatch.setenv("LABKIT_CACHE", str(blocker / "cache"))
    cache = KeyedCache("things", label="test", what="the thing")
    with pytest.warns(RuntimeWarning, match="test cache .* cannot be created.*the thing is "
                                            "measured again"):
        with cache.locked() as writable:
            assert not writable
    with pytest.warns(RuntimeWarning, match="cannot be written"):
        assert not cache.put("a", {"x": 1})
    assert cache.get("a") is None


def _hold(path: str, seconds: float) -> None:
    import os

    os.environ["LABKIT_CACHE"] = path
    with KeyedCache("things", label="test", what="the thing").locked():
        time.sleep(seconds)


def test_the_lock_makes_a_second_process_wait(cache: KeyedCache, tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    holder = ctx.Process(target=_hold, args=(str(tmp_path), 1.5))
    holder.start()
    try:
        deadline = time.monotonic() + 30
        while not cache.lock_path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # the holder has the lock file open and locked by now
        t0 = time.monotonic()
        with cache.locked():
            waited = time.monotonic() - t0
    finally:
        holder.join(30)
    assert holder.exitcode == 0 and waited > 0.2


def test_calibrate_and_the_planner_share_the_helper(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path))
    assert isinstance(calibrate.CACHE, KeyedCache) and isinstance(plan_local.CACHE, KeyedCache)
    assert calibrate.CACHE.path == tmp_path / "peak_flops.json"
    assert plan_local.CACHE.path == tmp_path / "step_cost.json"
    calibrate._store("k", {"rates": {}})
    assert calibrate._load() == {"k": {"rates": {}}}
