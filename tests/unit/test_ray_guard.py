"""The Ray session's guard (``labkit.launchers.ray.guard``) finds a session's processes by
the files they hold under the session's dirs, not only by the marker in their environment:
Ray's agents rename themselves with ``setproctitle``, which zeroes most of the memory that
``/proc/PID/environ`` shows, and agents whose marker was gone outlived killed drivers.
No Ray here: stand-ins named ``ray::...`` play the agents."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from labkit.launchers.ray import guard
from labkit.launchers.ray.session import GUARD_DIR_ENV, SESSION_ENV

AGENT = """
import sys, time
open('/proc/self/comm', 'w').write('ray::FakeAgent')  # what ray_processes looks for
log = open(sys.argv[1], 'w')  # an agent's log, under the session's dir
print('ready', flush=True)
time.sleep(120)
"""


def _agent(log: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != SESSION_ENV}  # no marker to find
    p = subprocess.Popen([sys.executable, "-c", AGENT, str(log)], env=env, text=True,
                         stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def test_a_process_holding_a_file_under_the_session_dir_is_the_sessions(tmp_path: Path) -> None:
    mine, other = tmp_path / "lkray-a", tmp_path / "lkray-ab"
    mine.mkdir(), other.mkdir()
    agent = _agent(other / "agent.log")
    try:  # a sibling dir whose name starts alike is not the session's
        assert not guard.holds_file_under(agent.pid, [str(mine)])
        assert guard.holds_file_under(agent.pid, [str(mine), str(other)])
        assert agent.pid in guard.session_processes("no-such-mark", [str(other)])
        assert agent.pid not in guard.session_processes("no-such-mark", [str(mine)])
    finally:
        agent.kill()
        agent.wait()
    assert not guard.holds_file_under(agent.pid, [str(other)])  # gone: no error


def test_a_killed_driver_leaves_no_agent_of_either_try(tmp_path: Path) -> None:
    """The driver is SIGKILLed right after writing a second try's dir to the guard's stdin:
    the guard kills the agents of the first try's dir (from its environment) and of the
    second's, and removes both dirs."""
    first, second = tmp_path / "lkray-1", tmp_path / "lkray-2"
    first.mkdir(), second.mkdir()
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    agents = [_agent(first / "a.log"), _agent(second / "b.log")]
    g = subprocess.Popen([sys.executable, "-m", "labkit.launchers.ray.guard", str(driver.pid),
                          "a-mark-no-process-has"], stdin=subprocess.PIPE,
                         env={**os.environ, GUARD_DIR_ENV: str(first)})
    try:
        assert g.stdin is not None
        g.stdin.write(f"{second}\n".encode())
        g.stdin.flush()
        driver.kill()
        driver.wait()
        assert g.wait(60) == 0
        for a in agents:
            assert a.wait(10) == -9
        assert not first.exists() and not second.exists()
    finally:
        for p in (driver, g, *agents):
            if p.poll() is None:
                p.kill()
                p.wait()
