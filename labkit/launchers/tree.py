"""A rank's whole process tree, daemons included: child subreapers and killing a subtree.

Teaches: where an orphan goes on Linux. When a process dies, its children are re-parented
-- by default to init (pid 1), where nobody owning the run can find them. That is how the
textbook daemon escapes (fork, ``setsid``, fork again, let the middle one exit, close every
descriptor: Stevens, "Advanced Programming in the UNIX Environment", section 13.3): it
leaves its parent, its process group, its session and every file it held. What it cannot
leave is its *ancestry*: ``prctl(PR_SET_CHILD_SUBREAPER)`` (Linux 3.4, ``prctl(2)``) makes a
process the one its orphaned descendants are re-parented to instead of init. So labkit
makes

* every rank a subreaper: while it runs, everything it started -- daemons included -- stays
  in its subtree, and a rank kills that subtree before it exits (``kill_tree``);
* the fork server (``labkit.launchers.forkserver_main``) a subreaper: whatever outlives a
  rank that died comes back to the server, which kills it at once; the server does the
  same for every rank when the kernel that started it dies.

``kill_tree`` stops the subtree first (SIGSTOP, scanning again until no new process
appears, so nothing can fork past the scan), then kills it. Only counting by the tree, not
by name or environment, finds a daemon that changed all three. The process table is read
with psutil (each process's parent and state, portably). Torch-free.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time

import psutil

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the one its orphaned descendants are re-parented to."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


GONE = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
"""States of a process that has exited (a zombie waits for its parent to reap it)."""


def processes() -> dict[int, tuple[int, str]]:
    """Every process: pid -> (parent pid, psutil status, e.g. "running" or "zombie")."""
    out = {}
    for proc in psutil.process_iter(["ppid", "status"]):
        ppid, status = proc.info["ppid"], proc.info["status"]
        if ppid is not None and status is not None:  # None: it exited while being read
            out[proc.pid] = (ppid, status)
    return out


def children_of(pid: int, table: dict[int, tuple[int, str]] | None = None) -> list[int]:
    """The live and zombie children of ``pid``."""
    table = processes() if table is None else table
    return sorted(p for p, (ppid, _) in table.items() if ppid == pid)


def descendants(pid: int, table: dict[int, tuple[int, str]] | None = None) -> list[int]:
    """Every live (non-zombie) descendant of ``pid``, nearest first."""
    table = processes() if table is None else table
    kids: dict[int, list[int]] = {}
    for p, (ppid, state) in table.items():
        if state not in GONE:
            kids.setdefault(ppid, []).append(p)
    out, todo = [], [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() in GONE
    except psutil.NoSuchProcess:
        return True


def kill_tree(pid: int, include_root: bool = False, rounds: int = 50,
              within_s: float = 5.0) -> list[int]:
    """SIGKILL every descendant of ``pid`` (and ``pid`` itself with ``include_root``): stop
    them all first, scanning until a scan finds no new one, so none forks past the kill;
    then wait (up to ``within_s``) until each has died. Returns the pids signalled.
    Zombies are left for their parent to reap."""
    stopped: list[int] = []
    seen: set[int] = set()
    for _ in range(rounds):
        found = [p for p in descendants(pid) if p not in seen and p != os.getpid()]
        if not found:
            break
        for p in found:
            seen.add(p)
            try:
                os.kill(p, signal.SIGSTOP)
                stopped.append(p)
            except (ProcessLookupError, PermissionError):
                pass
    targets = stopped + ([pid] if include_root and pid != os.getpid() else [])
    for p in targets:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + within_s
    waiting = [p for p in targets if p != pid or include_root]
    while waiting and time.monotonic() < deadline:  # a busy machine takes a moment
        waiting = [p for p in waiting if not _dead(p)]
        if waiting:
            time.sleep(0.005)
    return targets
