"""The scans that find a run's leftover processes, read through psutil: the reaper's (a
rank's process group, a live process against a zombie) and the emulated cluster's (a
process by its run id in the environment, a rank by its command line)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time

import pytest

from labkit.launchers import reaper
from labkit.launchers.cluster import leftovers as lo
from labkit.launchers.cluster import session

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture
def sleeper():
    """A process in its own group, tagged with a run id no other test uses; killed after."""
    started: list[subprocess.Popen] = []

    def start(**env: str) -> subprocess.Popen:
        proc = subprocess.Popen(SLEEP, start_new_session=True, env={**os.environ, **env})
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def test_a_rank_group_is_found_by_its_group_and_a_zombie_is_not_live(sleeper) -> None:
    proc = sleeper()
    assert reaper._live(proc.pid) and reaper._live(str(proc.pid))
    assert reaper._leftovers(f"none-{secrets.token_hex(4)}", {proc.pid}, set()) == [proc.pid]
    assert reaper.kill_leftovers(f"none-{secrets.token_hex(4)}", {proc.pid}) == [proc.pid]
    deadline = time.monotonic() + 10
    while reaper._live(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not reaper._live(proc.pid)  # a zombie (not reaped yet) no longer runs
    assert reaper._leftovers("none", {proc.pid}, {proc.pid}) == []
    proc.wait()
    assert not reaper._live(proc.pid)  # gone


def test_a_process_tagged_with_the_run_id_is_killed_wherever_its_group(sleeper) -> None:
    run_id = f"house-{secrets.token_hex(4)}"
    proc = sleeper(**{reaper.RUN_ID_ENV: run_id})
    deadline = time.monotonic() + 10
    while proc.pid not in reaper.tagged(reaper.RUN_ID_ENV, run_id) \
            and time.monotonic() < deadline:  # the environ appears once it has exec'd
        time.sleep(0.01)
    assert reaper.kill_leftovers(run_id, set()) == [proc.pid]
    assert proc.wait(10) == -9


def test_the_cluster_finds_its_processes_by_run_id_and_reads_their_command_line(
        sleeper, monkeypatch) -> None:
    """Under a variable of this test's own: a live cluster test elsewhere on the host counts
    every process carrying the real one as its leftover."""
    monkeypatch.setattr(lo, "ENV_RUN", "LABKIT_TEST_REAPER_SCAN_RUN")
    proc = sleeper(LABKIT_TEST_REAPER_SCAN_RUN="ab12c", **{lo.ENV_LOCK: "/tmp/x.lock"})
    deadline = time.monotonic() + 10
    while not (found := [r for r in lo.run_processes() if r[0] == proc.pid]) \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    assert found == [(proc.pid, "ab12c", "/tmp/x.lock")]
    assert session._cmdline(proc.pid) == " ".join(SLEEP)
    assert os.getpid() not in [pid for pid, _, _ in lo.run_processes()]
    proc.kill()
    proc.wait()
    assert session._cmdline(proc.pid) == ""
    assert [r for r in lo.run_processes() if r[0] == proc.pid] == []
