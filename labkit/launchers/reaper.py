"""Owning every process a run starts, and getting rid of all of them afterwards.

Teaches: why "kill the children" is harder than it looks on Linux. A rank is one process,
but student code can ``os.fork()``, start a ``multiprocessing`` pool, or launch a daemon
that calls ``setsid()`` and ignores SIGTERM. Three mechanisms, each covering what the
previous one misses (see ``setpgid(2)``, ``prctl(2)`` PR_SET_PDEATHSIG, ``proc(5)``):

1. *A process group per rank* (``start_new_session``): the rank and everything it forks
   share one group id, so ``killpg`` reaches a fork or a pool in one call.
2. *The parent-death signal* (set by the rank itself): if the supervisor dies (kill -9,
   "Restart kernel"), Linux SIGKILLs the rank. It is not inherited across ``fork``, which
   is why 1 and 3 exist.
3. *A run tag in the environment* (``LABKIT_RUN_ID``): every descendant inherits it, even
   one that left the group with ``setsid``; at shutdown the supervisor looks for it in
   ``/proc/*/environ`` and SIGKILLs whatever still carries it. Only a process that both
   leaves the group and replaces its whole environment escapes (a cgroup would catch that
   too, but needs privileges a student's laptop does not grant). A rank forked by
   ``labkit.launchers.forkserver`` shows the server's environment there instead (Linux keeps the copy
   made at ``exec``); its own is in its run directory's ``environ`` file, which it holds
   open and every fork of it inherits, and ``tagged`` reads that file too.

Also here: ``interrupts_deferred``, which holds back a second Ctrl-C (or the notebook's
stop button) while the cleanup runs, so a student pressing stop twice cannot leave ranks
behind. Torch-free: the supervisor imports it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from labkit.launchers.tree import GONE

RUN_ID_ENV = "LABKIT_RUN_ID"
"""Environment variable carrying the run's id into every rank and its descendants."""
PARENT_ENV = "LABKIT_PARENT_PID"
"""The supervisor's pid, so a rank whose parent died before it could arm PDEATHSIG exits."""


def _live(pid: int | str) -> bool:
    """Whether ``pid`` is a process that still runs (psutil reads its state portably)."""
    try:
        return psutil.Process(int(pid)).status() not in GONE
    except psutil.Error:  # gone, or not ours to read
        return False


ENVIRON_FILE = "environ"
"""In a run directory: the environment its ranks were given, ``/proc/PID/environ``'s format."""
FORKSERVER_ENV = "LABKIT_FORKSERVER_PID"
"""In a fork server's environment (``labkit.launchers.forkserver``), so every process it forked shows it
in ``/proc/PID/environ``: the hint to look for the run's ``ENVIRON_FILE`` too."""


def environ_entries(proc: Path) -> list[bytes]:
    """``KEY=VALUE`` entries of a process's environment. For a process forked by the fork
    server, also those of every run ``environ`` file it holds open (see the docstring)."""
    entries = (proc / "environ").read_bytes().split(b"\0")
    if not any(e.startswith(f"{FORKSERVER_ENV}=".encode()) for e in entries):
        return entries
    try:
        fds = list((proc / "fd").iterdir())
    except OSError:
        return entries
    for fd in fds:
        try:
            target = os.readlink(fd)
            if target.removesuffix(" (deleted)").endswith(os.sep + ENVIRON_FILE):
                entries += fd.read_bytes().split(b"\0")
        except OSError:
            continue
    return entries


def tagged(marker: str, value: str) -> list[int]:
    """Live (non-zombie) processes whose environment holds ``marker=value``."""
    entry = f"{marker}={value}".encode()
    me = os.getpid()
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == me:
            continue
        try:
            environ = environ_entries(proc)
        except OSError:  # gone, or another user's process
            continue
        if entry in environ and _live(proc.name):
            out.append(int(proc.name))
    return out


def environ_bytes(env: dict[str, str]) -> bytes:
    """``env`` as an ``ENVIRON_FILE`` holds it."""
    return b"\0".join(f"{k}={v}".encode(errors="surrogateescape") for k, v in env.items())


def _leftovers(run_id: str, pgids: set[int], seen: set[int]) -> list[int]:
    """Live processes of the run: tagged, in a rank's process group, or killed before."""
    found = set(tagged(RUN_ID_ENV, run_id)) | {p for p in seen if _live(p)}
    if pgids:
        for proc in psutil.process_iter(["status"]):
            try:
                group = os.getpgid(proc.pid)
            except OSError:  # gone since the table was read
                continue
            if group in pgids and proc.info["status"] not in (None, *GONE):
                found.add(proc.pid)
    found.discard(os.getpid())
    return sorted(found)


def kill_leftovers(run_id: str, pgids: set[int], within_s: float = 5.0) -> list[int]:
    """SIGKILL every live process of the run -- tagged with ``run_id`` or in one of the
    rank groups ``pgids`` -- and wait until each is dead (a zombie counts: it no longer
    runs). Scans again until a scan finds nothing: a process caught mid-fork may have made a
    child after the previous scan. Returns the pids it signalled."""
    killed: set[int] = set()
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        found = _leftovers(run_id, pgids, killed)
        if not found:
            break
        killed.update(sigkill(found))
        time.sleep(0.005)
    return sorted(killed)


def sigkill(pids: list[int]) -> list[int]:
    """SIGKILL each of ``pids``; those that were still there to signal."""
    hit = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            hit.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    return hit


def kill_group(pgid: int, sig: int) -> None:
    """Signal every process of a rank's group (the rank is its leader: pgid == its pid).

    Call it only while the leader is not yet reaped (alive or a zombie): then the group id
    cannot have been reused by an unrelated process.
    """
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def exited(proc: Any) -> bool:
    """Whether a rank process (a ``Popen`` or a ``labkit.launchers.forkserver.ForkedRank``) has
    exited, without reaping it: until it is reaped, its group id cannot be reused."""
    if proc.returncode is not None:
        return True
    if hasattr(proc, "exited"):
        return bool(proc.exited())
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def stop_leaders(procs: list[Any], stop: Deferred, grace_s: float) -> None:
    """Stop every rank still running: kill what it started (its whole subtree, daemons
    included: a rank is their subreaper, ``labkit.launchers.tree``) while it still holds
    them, SIGTERM its group, wait up to ``grace_s`` (cut short by a second Ctrl-C,
    ``stop.hit``), then SIGKILL the group *before* reaping its leader, so the group id
    cannot have been reused by then."""
    from labkit.launchers.tree import kill_tree

    live = [p for p in procs if p.returncode is None]
    for p in live:
        if not exited(p):
            kill_tree(p.pid)
    for p in live:
        kill_group(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    waiting = list(live)
    while waiting and not stop.hit and time.monotonic() < deadline:
        waiting = [p for p in waiting if not exited(p)]
        time.sleep(0.02)
    for p in live:
        kill_group(p.pid, signal.SIGKILL)
        try:
            p.wait(5.0)
        except subprocess.TimeoutExpired:  # unkillable (D state): left to init
            pass


class Deferred:
    """What ``interrupts_deferred`` saw: ``hit`` is True once an interrupt arrived."""

    def __init__(self) -> None:
        self.hit = False

    def handler(self, _signum: int, _frame: Any) -> None:
        self.hit = True


@contextmanager
def interrupts_deferred() -> Iterator[Deferred]:
    """Hold back SIGINT (Ctrl-C, the notebook's stop button) for the body; raise it after.

    Only the main thread receives Python signal handlers, so elsewhere this does nothing.
    The body can read ``.hit`` to cut waits short (a second stop means "now").
    """
    state = Deferred()
    previous: Any = None
    if threading.current_thread() is threading.main_thread():
        try:
            previous = signal.signal(signal.SIGINT, state.handler)
        except ValueError:  # not allowed here (e.g. an embedded interpreter)
            previous = None
    try:
        yield state
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    if state.hit:
        if callable(previous):
            previous(signal.SIGINT, None)  # the default handler raises KeyboardInterrupt
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt


def die_with_parent(parent_pid: int | None = None, signum: int | None = None) -> None:
    """Ask Linux to SIGKILL this rank (or send ``signum``) if the supervisor dies (no
    orphans, even on kill -9).

    The signal is armed only from this call on: a parent that died between our ``fork``
    and here left us re-parented already, which ``parent_pid`` (the supervisor's pid, when
    known) detects. A new session (``start_new_session``) does not disarm it.
    """
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL if signum is None else signum)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)  # the supervisor is gone already: nobody will read our result
