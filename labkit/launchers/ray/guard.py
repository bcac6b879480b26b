"""The guard of one Ray session: whatever happens to the process that started Ray, every
process of that session is gone within seconds of it.

Ray ties its GCS and raylet to the driver that started them, but its agents
(``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) only notice a dead raylet after up to a
minute, and a Ctrl-C that lands while Ray starts, or a driver killed outright (SIGKILL, a
crash, "Restart kernel"), runs none of the driver's cleanup. So ``ensure_ray`` starts this
small process first (``python -m labkit.launchers.ray.guard DRIVER_PID MARK``, in a session
of its own, without the marker, the session's temp dir in ``GUARD_DIR_ENV``): it waits until
the driver exits or closes the guard's stdin (``shutdown_ray``), then SIGKILLs every Ray
process of the session and removes the session's temp dirs. A Ray process is the session's
when its environment holds ``LABKIT_RAY_SESSION=MARK`` (every Ray process inherits the
driver's environment, set before ``ray.init``: ``labkit.launchers.reaper.tagged``) or when
it holds a file open under one of the session's dirs (its logs): Ray's agents rename
themselves with ``setproctitle``, which zeroes most of the memory that
``/proc/PID/environ`` reads, so the marker is gone from theirs (seen: 1,118 of 1,124 entries
empty, the marker among them) -- they are the processes that outlived killed drivers. A
second try of ``ensure_ray`` uses a new dir; the driver writes its path to the guard's stdin,
one line per dir.

The pattern is a supervisor's watchdog (PR_SET_PDEATHSIG in ``labkit.launchers.reaper``),
moved out of the process it watches. Torch-free and Ray-free: it imports neither.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import sys
import time
from collections.abc import Sequence

from labkit.launchers.ray.session import GUARD_DIR_ENV, SESSION_ENV

SETTLE_S = 1.0
"""How long the guard keeps looking after a kill that found nothing new (a raylet that was
starting a worker as it was killed)."""


def open_paths(pid: int) -> list[str]:
    """What process ``pid``'s open file descriptors point at (none when it is gone or not
    ours to read)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    out = []
    for fd in fds:
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:  # closed since the listing
            continue
    return out


def holds_file_under(pid: int, dirs: Sequence[str]) -> bool:
    """Whether process ``pid`` has a file open under one of ``dirs``."""
    roots = tuple(os.path.join(d, "") for d in dirs if d)
    return bool(roots) and any(path.startswith(roots) for path in open_paths(pid))


def session_processes(mark: str, dirs: Sequence[str] = ()) -> list[int]:
    """Live Ray processes (``ray_processes``) that carry ``SESSION_ENV=mark`` or hold a file
    open under one of the session's ``dirs``."""
    from labkit.launchers.ray.session import ray_processes
    from labkit.launchers.reaper import tagged

    ours = set(tagged(SESSION_ENV, mark))
    return [pid for pid, _ in ray_processes() if pid in ours or holds_file_under(pid, dirs)]


def kill_session(mark: str, within_s: float = 30.0, dirs: Sequence[str] = ()) -> list[int]:
    """SIGKILL every process of the session until none is left for ``SETTLE_S`` (or
    ``within_s``: generous, since on a loaded machine one scan of every process's environment
    takes seconds); the pids."""
    from labkit.launchers.reaper import sigkill

    killed: list[int] = []
    deadline = time.monotonic() + within_s
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        found = session_processes(mark, dirs)
        if found:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > SETTLE_S:
            break
        killed += sigkill(found)
        time.sleep(0.1)
    return killed


def main(argv: list[str]) -> int:
    driver, mark = int(argv[0]), argv[1]
    dirs = [d for d in [os.environ.get(GUARD_DIR_ENV, "")] if d]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the terminal is the driver's
    try:
        watched = [os.pidfd_open(driver)]
    except ProcessLookupError:
        watched = []  # gone already: read what it wrote, then clean up now
    stdin, told = sys.stdin.fileno(), b""
    while True:
        ready, _, _ = select.select([stdin, *watched], [], [], None if watched else 0)
        if stdin in ready:  # first: what the driver wrote before it died counts
            got = os.read(stdin, 4096)
            if not got:  # EOF: shutdown_ray is done with us, or the driver is gone
                break
            *lines, told = (told + got).split(b"\n")  # a later try's dir, one a line
            dirs += [line.decode() for line in lines if line]
        else:  # the driver exited, and nothing is left to read
            break
    kill_session(mark, dirs=dirs)
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
