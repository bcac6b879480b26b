"""Run directories and processes nobody owns any more: found by a lock, removed by the next
run or by ``labkit doctor --clean``.

A supervisor's run directory (``labkit-run-<id>`` in the temp dir: the rendezvous store,
the ranks' logs, the job) is removed when the run ends -- unless the process that ran it
was killed outright (``kill -9``, a notebook's "Restart kernel" that does not wait). So
each run holds an exclusive ``flock`` on ``<run dir>/owner.lock`` for its whole life; Linux
drops the lock when the process dies, however it dies. A run directory whose lock anyone
can take belongs to a dead run: ``sweep`` removes it (every supervisor calls it before it
starts), and ``clean`` also kills the processes still tagged with a dead run's id
(``LABKIT_RUN_ID``, ``LABKIT_RUN_DIR``: ``labkit.launchers.reaper``), the same rule as the
emulated cluster's (``labkit.launchers.cluster.leftovers``). Torch-free.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from labkit.base.files import try_lock

PREFIX = "labkit-run-"
OWNER = "owner.lock"
RUN_DIR_ENV = "LABKIT_RUN_DIR"
"""The run directory, in every rank's environment (a dead run's processes are found by it)."""
YOUNG_S = 600.0
"""A run directory without its lock yet is left alone this long (it may be starting)."""


def hold(run_dir: Path) -> IO[bytes]:
    """Lock ``run_dir`` as alive for as long as the returned file stays open.

    The lock file appears under its name already locked (locked under a private name, then
    renamed: the lock belongs to the file, not the name), so another run's ``sweep`` never
    sees it unlocked, and never holds it while this run tries to take it."""
    private = run_dir / f".{OWNER}.{os.getpid()}"
    handle = open(private, "wb")  # noqa: SIM115 - held for the run's life
    if not try_lock(handle):  # a private name nobody else opens: cannot be held
        raise RuntimeError(f"{private} is locked by another process")
    os.replace(private, run_dir / OWNER)
    return handle


def is_dead(run_dir: Path) -> bool:
    """Whether no live process holds ``run_dir``'s lock."""
    try:
        with open(run_dir / OWNER, "rb") as handle:
            return try_lock(handle)
    except FileNotFoundError:
        try:  # no lock (yet, or a run older than the lock): dead once it is old
            return time.time() - run_dir.stat().st_mtime > YOUNG_S
        except OSError:
            return False
    except OSError:
        return False


def sweep(tmp: str | None = None, prefix: str = PREFIX) -> list[str]:
    """Remove the directories named ``prefix...`` in ``tmp`` (default: the temp dir) whose
    owner is dead: a supervisor's runs by default, Ray's sessions with ``prefix="lkray-"``."""
    root = Path(tmp or tempfile.gettempdir())
    removed = []
    try:
        entries = [e for e in root.iterdir() if e.name.startswith(prefix) and e.is_dir()]
    except OSError:
        return []
    for entry in entries:
        if is_dead(entry):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(str(entry))
    return removed


def dead_run_processes() -> list[int]:
    """Live processes tagged with a run whose directory nobody holds (or is gone)."""
    from labkit.launchers.reaper import RUN_ID_ENV, environ_entries

    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            env = dict(e.partition(b"=")[::2] for e in environ_entries(proc) if b"=" in e)
        except OSError:
            continue
        run_dir = env.get(RUN_DIR_ENV.encode())
        if env.get(RUN_ID_ENV.encode()) and run_dir and int(proc.name) != os.getpid():
            path = Path(os.fsdecode(run_dir))
            if not path.exists() or is_dead(path):
                out.append(int(proc.name))
    return sorted(out)


def clean(tmp: str | None = None) -> dict[str, Any]:
    """What ``labkit doctor --clean`` does for the supervisor's runs: kill the processes of
    dead runs (with their subtrees), then remove the dead runs' directories."""
    from labkit.launchers.tree import kill_tree

    killed = []
    for pid in dead_run_processes():
        killed += kill_tree(pid, include_root=True)
    return {"processes": sorted(set(killed)), "run_dirs": sweep(tmp)}
