"""Ctrl-C and a killed caller under ``labkit run ddp --launcher ray`` (issue 36, item 5): at
each point -- while Ray starts, while Ray Train starts the ranks, mid-training -- the CLI
exits with its interrupt code (130; -9 when it was SIGKILLed itself), never a crash, and no
Ray process of the run is left a few seconds later (seen before: ``ray::DashboardAgent``
and ``ray::RuntimeEnvAgent`` alive 10 s after a Ctrl-C, and a segfault at exit).

Each case starts a Ray of its own in a CLI process; its processes inherit a marker in
their environment, so the count sees only them (``labkit.launchers.reaper.tagged``), and
Ray's agents, whose environment ``setproctitle`` wipes, are found by the files they hold
under the run's session dir (``_session_dirs``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from labkit.launchers.ray import guard, ray_processes
from labkit.launchers.ray.session import PREFIX
from labkit.launchers.reaper import tagged

pytestmark = [pytest.mark.distributed, pytest.mark.lesson12, pytest.mark.timeout(600)]

MARK = "LABKIT_TEST_RAY_CLI_MARK"
GONE_WITHIN_S = 30.0
"""How long after the CLI's exit its Ray processes may still be dying: half of what Ray's
agents take alone (up to a minute), so a guard that did nothing still fails; at 10 s the
SIGKILL case failed beside the full suite, where the guard's scans of every process's
environment take seconds each."""


def _ray_of(mark: str) -> list[tuple[int, str]]:
    ours = set(tagged(MARK, mark))
    return [(pid, name) for pid, name in ray_processes() if pid in ours]


def _session_dirs(mark: str) -> set[str]:
    """The Ray session dirs (``session.PREFIX``) that processes of the run hold files under:
    how its processes are found once ``setproctitle`` has wiped their environment (Ray's
    agents: ``labkit.launchers.ray.guard``)."""
    dirs = set()
    for pid in tagged(MARK, mark):
        for path in guard.open_paths(pid):
            parts = path.split("/")
            at = next((i for i, part in enumerate(parts) if part.startswith(PREFIX)), None)
            if at is not None:
                dirs.add("/".join(parts[:at + 1]))
    return dirs


def _left(mark: str, dirs: set[str]) -> list[int]:
    """Processes of the run still alive: carrying the marker, or Ray's holding its dirs."""
    held = [pid for pid, _ in ray_processes() if guard.holds_file_under(pid, sorted(dirs))]
    return sorted(set(tagged(MARK, mark)) | set(held))


def _wait_for(what, p: subprocess.Popen[bytes], limit_s: float = 300.0) -> None:
    deadline = time.monotonic() + limit_s
    while not what():
        if p.poll() is not None:
            _, err = p.communicate()
            raise AssertionError(f"the run ended before the interrupt point: {p.returncode}\n"
                                 + err.decode(errors="replace")[-3000:])
        assert time.monotonic() < deadline, "the interrupt point was never reached"
        time.sleep(0.05)


@pytest.mark.parametrize("point, sig", [
    ("ray-start", signal.SIGINT),  # Ray's GCS or raylet is up, ray.init has not returned
    ("rank-start", signal.SIGINT),  # Ray Train's worker actors exist, no step is done
    ("training", signal.SIGINT),  # a checkpoint was written
    ("training", signal.SIGKILL),  # the caller killed outright: no cleanup of its own runs
])
def test_an_interrupted_ray_run_leaves_no_ray_process(point, sig, tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    ckpt = tmp_path / "ckpt"
    env = {**os.environ, MARK: mark, "TMPDIR": str(tmp_path)}  # Ray Train's storage goes here
    env.pop("RAY_ADDRESS", None)
    p = subprocess.Popen(
        [sys.executable, "-m", "labkit", "run", "ddp", "--launcher", "ray", "--world-size", "2",
         "--steps", "400", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        if point == "ray-start":
            _wait_for(lambda: any(n in ("raylet", "gcs_server") for _, n in _ray_of(mark)), p)
        elif point == "rank-start":
            _wait_for(lambda: any(n.startswith("ray::RayTrain") for _, n in _ray_of(mark)), p)
        else:
            _wait_for(lambda: ckpt.is_dir() and any(ckpt.glob("step_*")), p)
        dirs = _session_dirs(mark)
        p.send_signal(sig)
        _, err_bytes = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    err = err_bytes.decode(errors="replace")
    if sig == signal.SIGINT:
        assert p.returncode == 130, (p.returncode, err[-3000:])
        assert "stopped by Ctrl-C" in err, err[-3000:]
    else:
        assert p.returncode == -signal.SIGKILL, (p.returncode, err[-3000:])
    deadline = time.monotonic() + GONE_WITHIN_S
    while (left := _left(mark, dirs)) and time.monotonic() < deadline:
        time.sleep(0.2)
    names = {pid: name for pid, name in ray_processes()}
    for pid in left:  # never leave them to the next test, then fail
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"processes of the run outlived the CLI by {GONE_WITHIN_S:g} s " \
        f"(Ray's: {[names[p] for p in left if p in names]}): {left}"
    # Ray Train's storage: removed by the driver, or after a SIGKILL by the session's guard
    # once it has killed the session (SETTLE_S after the last process went)
    while (storage := list(tmp_path.glob("labkit-run-raytrain-*"))) \
            and time.monotonic() < deadline + 10:
        time.sleep(0.2)
    assert storage == [], f"Ray Train's storage outlived the CLI: {storage}"
