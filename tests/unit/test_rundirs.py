"""Run directories of dead runs (issue 25, item 5): a run holds a lock on its directory for
its life; a directory whose lock anyone can take belongs to a dead run and is swept."""

from __future__ import annotations

import os
import time

from labkit.launchers import rundirs


def test_only_the_directories_of_dead_runs_are_swept(tmp_path) -> None:
    live, dead, young, old = (tmp_path / f"{rundirs.PREFIX}{n}" for n in ("a", "b", "c", "d"))
    for d in (live, dead, young, old):
        d.mkdir()
    held = rundirs.hold(live)  # this process runs it
    rundirs.hold(dead).close()  # its run died: the lock is free
    os.utime(old, (time.time() - 2 * rundirs.YOUNG_S,) * 2)  # no lock, long ago
    (tmp_path / "someone-elses").mkdir()
    try:
        removed = rundirs.sweep(str(tmp_path))
    finally:
        held.close()
    assert sorted(removed) == sorted([str(dead), str(old)])
    assert live.exists() and young.exists() and (tmp_path / "someone-elses").exists()


def test_a_run_directory_is_alive_while_its_lock_is_held(tmp_path) -> None:
    held = rundirs.hold(tmp_path)
    assert not rundirs.is_dead(tmp_path)
    held.close()
    assert rundirs.is_dead(tmp_path)
