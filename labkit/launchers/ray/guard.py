"""The guard of one Ray session: whatever happens to the process that started Ray, every
process of that session is gone within seconds of it.

Ray ties its GCS and raylet to the driver that started them, but its agents
(``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) only notice a dead raylet after up to a
minute, and a Ctrl-C that lands while Ray starts, or a driver killed outright (SIGKILL, a
crash, "Restart kernel"), runs none of the driver's cleanup. So ``ensure_ray`` starts this
small process first (``python -m labkit.launchers.ray.guard DRIVER_PID MARK``, in a session
of its own, without the marker, the session's temp dir in ``GUARD_DIR_ENV``): it waits until
the driver exits or closes the guard's stdin (``shutdown_ray``), then SIGKILLs every Ray
process whose environment holds ``LABKIT_RAY_SESSION=MARK`` (every Ray process inherits the
driver's environment, set before ``ray.init``: ``labkit.launchers.reaper.tagged``) and
removes the session's temp dir.

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

from labkit.launchers.ray.session import GUARD_DIR_ENV, SESSION_ENV

SETTLE_S = 1.0
"""How long the guard keeps looking after a kill that found nothing new (a raylet that was
starting a worker as it was killed)."""


def session_processes(mark: str) -> list[int]:
    """Live Ray processes (``ray_processes``) that carry ``SESSION_ENV=mark``."""
    from labkit.launchers.ray.session import ray_processes
    from labkit.launchers.reaper import tagged

    ours = set(tagged(SESSION_ENV, mark))
    return [pid for pid, _ in ray_processes() if pid in ours]


def kill_session(mark: str, within_s: float = 30.0) -> list[int]:
    """SIGKILL every process of the session until none is left for ``SETTLE_S`` (or
    ``within_s``: generous, since on a loaded machine one scan of every process's environment
    takes seconds); the pids."""
    from labkit.launchers.reaper import sigkill

    killed: list[int] = []
    deadline = time.monotonic() + within_s
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        found = session_processes(mark)
        if found:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > SETTLE_S:
            break
        killed += sigkill(found)
        time.sleep(0.1)
    return killed


def main(argv: list[str]) -> int:
    driver, mark = int(argv[0]), argv[1]
    session_dir = os.environ.get(GUARD_DIR_ENV, "")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the terminal is the driver's
    try:
        driver_fd = os.pidfd_open(driver)
    except ProcessLookupError:
        driver_fd = None  # gone already: clean up now
    if driver_fd is not None:
        watched = [driver_fd, sys.stdin.fileno()]
        while True:
            ready, _, _ = select.select(watched, [], [])
            if driver_fd in ready:
                break
            if not os.read(sys.stdin.fileno(), 64):  # EOF: shutdown_ray is done with us
                break
    kill_session(mark)
    if session_dir:
        shutil.rmtree(session_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
