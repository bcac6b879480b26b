"""``labkit.base.files``: the one atomic write and the one flock of the lab."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from labkit.base.files import exclusive, try_lock, write_atomic, write_json_atomic


def test_an_atomic_write_replaces_the_whole_file_and_leaves_no_temp(tmp_path):
    path = write_json_atomic(tmp_path / "sub" / "a.json", {"x": 1}, indent=1)
    assert json.loads(path.read_text()) == {"x": 1} and path.read_text().endswith("\n")
    write_atomic(path, b"new")
    assert path.read_bytes() == b"new"
    assert [p.name for p in path.parent.iterdir()] == ["a.json"]


def test_a_write_that_fails_midway_keeps_the_old_file(tmp_path, monkeypatch):
    path = write_atomic(tmp_path / "a.txt", "old")

    def boom(*_a):
        raise OSError("disk full")
    monkeypatch.setattr("labkit.base.files.os.fsync", boom)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, "new")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_a_lock_is_refused_while_another_process_holds_it_and_free_once_it_dies(tmp_path):
    lock = tmp_path / "x.lock"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
        "print('held', flush=True); time.sleep(60)"), str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with open(lock, "a") as handle:
            assert not try_lock(handle)
    finally:
        holder.kill()
        holder.wait()
    with open(lock, "a") as handle:  # the kernel dropped the dead holder's lock
        assert try_lock(handle)
    with exclusive(lock):  # a fresh handle of this process waits for, then takes, the lock
        pass
