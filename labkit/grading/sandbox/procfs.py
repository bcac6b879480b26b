"""What a box is using right now, read from outside it through ``/proc`` (proc(5)).

Every process of a box descends from the process the grader started (``bwrap``,
``unshare`` or the server itself): a double fork only moves a process under the box's
own first process, never out of the box's pid namespace. So the box's CPU time is the sum,
over that process tree, of ``utime + stime`` (its own) and ``cutime + cstime`` (children
it has reaped: their time moves to the reaper when they are waited for); nothing is
counted twice because a reaped child is no longer in the tree. Works without cgroups and
without privileges (``/proc/PID/stat`` is readable by everyone).

Also here: the few other questions the box asks of ``/proc`` (is a pid still the first
process of its namespace, who is a process's first child, how many tasks a user runs).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Usage:
    """A box at one moment: CPU seconds used so far, and tasks (processes and threads) alive."""

    cpu_s: float = 0.0
    tasks: int = 0
    processes: int = 0


def _stat(pid: str) -> tuple[int, float, int] | None:
    """(ppid, CPU seconds incl. reaped children, threads) of one process, or None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    # fields[0] is the state (field 3 of proc(5)): utime is field 14, so fields[11]
    ticks = sum(int(v) for v in fields[11:15])
    return int(fields[1]), ticks / TICKS, int(fields[17])


Table = dict[int, tuple[int, float, int]]
"""pid -> (ppid, CPU seconds incl. reaped children, threads): one reading of /proc."""


def table() -> Table:
    """Every process now (one pass over /proc, shared by every box that is read)."""
    out: Table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            row = _stat(entry)
            if row is not None:
                out[int(entry)] = row
    return out


def usage(root: int, now: Table | None = None) -> Usage:
    """CPU and tasks of ``root`` and all its descendants (in ``now``, else a fresh reading)."""
    now = table() if now is None else now
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in now.items():
        children.setdefault(ppid, []).append(pid)
    cpu, tasks, procs = 0.0, 0, 0
    todo = [root] if root in now else []
    while todo:
        pid = todo.pop()
        _, seconds, threads = now[pid]
        cpu, tasks, procs = cpu + seconds, tasks + threads, procs + 1
        todo.extend(children.get(pid, []))
    return Usage(cpu, tasks, procs)


def tmp_used(init_pid: int | None, folder: str = "tmp") -> tuple[int, int] | None:
    """(bytes used, bytes in all) of the box's ``/tmp``, seen through its first process's
    root (``/proc/PID/root``); None where that is not visible (mode none)."""
    if init_pid is None:
        return None
    try:
        st = os.statvfs(f"/proc/{init_pid}/root/{folder}")
    except OSError:
        return None
    total = st.f_blocks * st.f_frsize
    return total - st.f_bfree * st.f_frsize, total


def is_namespace_init(pid: int) -> bool:
    """Is ``pid`` still the first process of a pid namespace (not a recycled pid)?"""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    nspid = next((line.split()[1:] for line in status.splitlines()
                  if line.startswith("NSpid:")), [])
    return len(nspid) > 1 and nspid[-1] == "1"


def first_child(pid: int) -> int | None:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                return int(entry)
    return None


def user_tasks() -> int:
    """Tasks this user runs now (what RLIMIT_NPROC counts outside a user namespace)."""
    uid, count = os.getuid(), 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry}/task"))
            except OSError:
                continue
    return count
