"""Nothing left behind: run ids, the lock that says a run is alive, and the sweep.

Every emulated-cluster run gets a short random id; its namespaces, interfaces and processes
carry it (``labkit-<id>-n0``, ``labkit<id>n0``, the environment variable
``LABKIT_CLUSTER_RUN=<id>`` of every process it starts). While the run lives, the process
that started it holds an exclusive ``flock`` on ``<lock dir>/<id>.lock``; the kernel drops
that lock when the process dies, however it dies (kill -9 included). So "leftover" has a
precise meaning: labkit namespaces or processes whose run's lock nobody holds. ``sweep()``
removes exactly those; it runs before every cluster run and from ``labkit doctor --clean``.
Two runs never collide: an id is used only if its lock could be taken and no namespace
with that id exists.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil

from labkit.base.files import try_lock
from labkit.launchers.cluster import netns

ENV_RUN = "LABKIT_CLUSTER_RUN"
ENV_LOCK = "LABKIT_CLUSTER_LOCK"
_NS_RE = re.compile(rf"^{netns.PREFIX}-([0-9a-f]{{5}})-(?:n\d+|sw)$")


def lock_dir() -> Path:
    """/run/labkit for root (cleared at boot, like the namespaces); a per-user temp dir else."""
    if os.geteuid() == 0:
        return Path("/run/labkit")
    return Path(tempfile.gettempdir()) / f"labkit-cluster-{os.geteuid()}"


def lock_path(run_id: str) -> Path:
    return lock_dir() / f"{run_id}.lock"


@dataclass
class RunLock:
    """A live run's id and the open, locked file that proves it is alive."""

    run_id: str
    path: Path
    handle: IO[bytes] | None = field(default=None, repr=False)

    def release(self) -> None:
        if self.handle is not None:
            self.handle.close()  # closing drops the flock
            self.handle = None
        self.path.unlink(missing_ok=True)


def _try_lock(path: Path) -> IO[bytes] | None:
    """The file at ``path``, exclusively locked, or None if another process holds it.

    A lock on a file that a sweep unlinked meanwhile proves nothing, so the lock counts
    only if ``path`` still names the locked file (sweeps unlink only while holding it).
    """
    handle = open(path, "a+b")  # noqa: SIM115 - kept open: the lock lives as long as the file
    try:
        if not try_lock(handle) or os.stat(path).st_ino != os.fstat(handle.fileno()).st_ino:
            raise FileNotFoundError(path)
    except OSError:
        handle.close()
        return None
    return handle


def new_run(existing: list[str] | None = None) -> RunLock:
    """A fresh run id, locked by this process, used by no namespace on this host."""
    directory = lock_dir()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    taken = {m.group(1) for ns in (existing if existing is not None else [])
             if (m := _NS_RE.match(ns))}
    for _ in range(100):
        run_id = secrets.token_hex(3)[:5]
        if run_id in taken:
            continue
        path = directory / f"{run_id}.lock"
        handle = _try_lock(path)
        if handle is not None:
            return RunLock(run_id, path, handle)
    raise RuntimeError("could not find a free labkit cluster run id in 100 tries")


def is_alive(lock: Path, *, remove_if_dead: bool = False) -> bool:
    """True while some process holds the run's lock (``remove_if_dead``: unlink it if not,
    while holding it, so no new run can be handed the same file)."""
    if not lock.exists():
        return False
    try:
        handle = _try_lock(lock)
    except OSError:
        return False
    if handle is None:
        return lock.exists()
    if remove_if_dead:
        lock.unlink(missing_ok=True)
    handle.close()
    return False


def run_processes() -> list[tuple[int, str, str]]:
    """(pid, run id, lock path) of every process on this host a labkit cluster run started."""
    found, me = [], os.getpid()
    for proc in psutil.process_iter(["environ"]):
        env = proc.info["environ"]  # None: not ours to read, or a zombie
        if proc.pid != me and env and ENV_RUN in env:
            found.append((proc.pid, env[ENV_RUN], env.get(ENV_LOCK, "")))
    return found


@dataclass
class SweepReport:
    """What a sweep removed."""

    namespaces: list[str] = field(default_factory=list)
    processes: list[int] = field(default_factory=list)
    locks: list[str] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.namespaces or self.processes or self.locks or self.dirs)

    def __str__(self) -> str:
        if not self:
            return "no labkit cluster leftovers"
        return (f"removed {len(self.namespaces)} namespace(s) {', '.join(self.namespaces)}; "
                f"killed {len(self.processes)} process(es); {len(self.locks)} stale lock(s), "
                f"{len(self.dirs)} run dir(s)")


def sweep(run_id: str | None = None) -> SweepReport:
    """Remove leftovers: of every dead run (``run_id`` None) or of one run, alive or not.

    1. processes of those runs (SIGKILL), 2. their namespaces (veths and bridges go with
    them), 3. their run directories (logs, results), 4. their lock files.
    """
    report = SweepReport()

    def doomed(rid: str, lock: str) -> bool:
        if run_id is not None:
            return rid == run_id
        return not is_alive(Path(lock) if lock else lock_path(rid))

    for pid, rid, lock in run_processes():
        if doomed(rid, lock):
            try:
                os.kill(pid, signal.SIGKILL)
                report.processes.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
    if os.geteuid() == 0 and _has_ip():
        for ns in netns.labkit_namespaces():
            m = _NS_RE.match(ns)
            if m and doomed(m.group(1), ""):
                netns.delete_namespace(ns)
                report.namespaces.append(ns)
    for run_dir in Path(tempfile.gettempdir()).glob("labkit-cluster-?????-*"):
        rid = run_dir.name.split("-")[2]
        if run_dir.is_dir() and doomed(rid, ""):  # the launcher's logs and results
            shutil.rmtree(run_dir, ignore_errors=True)
            report.dirs.append(run_dir.name)
    directory = lock_dir()
    if directory.is_dir():
        for path in directory.glob("*.lock"):
            if (run_id is None or path.stem == run_id) and not is_alive(path,
                                                                        remove_if_dead=True):
                report.locks.append(path.stem)
    return report


def _has_ip() -> bool:
    import shutil

    return shutil.which("ip") is not None
