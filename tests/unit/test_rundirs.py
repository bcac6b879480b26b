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


def test_a_run_starting_beside_sweeps_is_never_taken_for_dead(tmp_path, monkeypatch) -> None:
    """Many students start runs at once, and every run sweeps first: a run whose lock file
    exists is locked already (found by six concurrent DDP runs, one of whose fresh run
    directory another run's sweep removed), and a sweep never makes the owner's lock fail.
    The moment between creating a file and locking it is widened to make the race show."""
    import builtins
    import threading

    def slow_open(path, mode="r", *args, **kwargs):  # type: ignore[no-untyped-def]
        handle = builtins.open(path, mode, *args, **kwargs)  # noqa: SIM115 - returned open, like open()
        if "w" in mode:
            time.sleep(0.002)
        return handle

    monkeypatch.setattr(rundirs, "open", slow_open, raising=False)
    stop, errors = threading.Event(), []

    def sweeper() -> None:
        while not stop.is_set():
            rundirs.sweep(str(tmp_path))

    threads = [threading.Thread(target=sweeper) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for i in range(200):
            run_dir = tmp_path / f"{rundirs.PREFIX}{i}"
            run_dir.mkdir()
            try:
                with rundirs.hold(run_dir):
                    if not run_dir.exists():
                        errors.append(f"{run_dir.name} removed while its run held it")
            except OSError as exc:
                errors.append(f"{run_dir.name}: {exc!r}")
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == [], errors[:5]
