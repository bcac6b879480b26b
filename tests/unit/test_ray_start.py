"""Ray on a busy laptop (issue 25, item 7), without starting Ray: a failed start is cleaned
up and tried once more; a second failure names the machine's load; Ray's own limits are
raised unless the user set them."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from labkit.launchers import rundirs
from labkit.launchers.ray import session

pytestmark = pytest.mark.lesson12


class FakeRay:
    def __init__(self, failures: int):
        self.failures, self.inits, self.shutdowns = failures, 0, 0

    def is_initialized(self) -> bool:
        return False

    def init(self, **kwargs: Any) -> None:
        self.inits += 1
        if self.inits <= self.failures:
            raise Exception("The current node timed out during startup.")  # Ray's own type

    def shutdown(self) -> None:
        self.shutdowns += 1


@pytest.fixture
def fake_ray(monkeypatch, tmp_path):
    def make(failures: int) -> FakeRay:
        ray = FakeRay(failures)
        monkeypatch.setattr(session.tempfile, "mkdtemp", lambda **kw: str(tmp_path))
        monkeypatch.setitem(session._state, "tmp", None)
        monkeypatch.setitem(session._state, "owner", None)
        monkeypatch.setattr(session, "_session_root", lambda: str(tmp_path / "root"))
        monkeypatch.setattr(session, "_ray_module", lambda: ray)
        monkeypatch.setattr(session, "_abandon", lambda tmp, guard=None: ray.shutdown())
        monkeypatch.setattr(session.atexit, "register", lambda fn: None)
        monkeypatch.setitem(session._state, "started", False)
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        for var in session.BUSY_MACHINE_LIMITS:
            monkeypatch.delenv(var, raising=False)
        return ray
    return make


def test_a_start_that_times_out_once_is_tried_again(fake_ray, monkeypatch) -> None:
    ray = fake_ray(1)
    monkeypatch.setenv("RAY_health_check_timeout_ms", "12345")  # the user's own setting
    assert session.ensure_ray() is ray
    assert (ray.inits, ray.shutdowns) == (2, 1)
    assert os.environ["RAY_worker_register_timeout_seconds"] == "300"  # noqa: SIM112 - Ray's name
    assert os.environ["RAY_health_check_timeout_ms"] == "12345"  # noqa: SIM112


def test_two_failed_starts_name_the_load(fake_ray) -> None:
    fake_ray(2)
    with pytest.raises(session.RayStartFailed, match=r"load average [\d.]+ / [\d.]+ / [\d.]+"):
        session.ensure_ray()


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal (where a line can redraw)."""

    def isatty(self) -> bool:
        return True


def test_a_slow_start_says_ray_is_starting_on_stderr(fake_ray, monkeypatch, capsys) -> None:
    """Issue 39: a start still going after SAY_START_AFTER_S says so, with its elapsed time;
    stdout (a `--json` result) stays clean. The fake start waits for the line, not a clock."""
    ray = fake_ray(0)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(session, "SAY_START_AFTER_S", 0.0)
    said = threading.Event()

    def slow_init(**kwargs: Any) -> None:
        for _ in range(500):  # until the line shows (5 s at most)
            if "starting Ray" in terminal.getvalue():
                said.set()
                return
            time.sleep(0.01)

    monkeypatch.setattr(ray, "init", slow_init)
    assert session.ensure_ray() is ray
    assert said.is_set() and "scheduler, object store and workers" in terminal.getvalue()
    assert capsys.readouterr().out == ""


def test_a_quick_start_says_nothing(fake_ray, monkeypatch) -> None:
    ray = fake_ray(0)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(session, "SAY_START_AFTER_S", 600.0)
    assert session.ensure_ray() is ray and terminal.getvalue() == ""


def _held_by_a_killed_process(path: Path) -> None:
    """``path`` locked as alive by a process that is then SIGKILLed (no cleanup ran)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from labkit.launchers import rundirs; h = rundirs.hold(Path(sys.argv[1])); "
         "print('held', flush=True); time.sleep(600)", str(path)],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    holder.send_signal(signal.SIGKILL)
    holder.wait()


def test_a_start_sweeps_the_session_dirs_of_killed_drivers_only(fake_ray, tmp_path) -> None:
    """Issue 39: a driver killed outright leaves its ``lkray-*`` dir; the next start removes
    it, and leaves a live session's dir (its owner holds the lock) and a dir too young to
    have its lock yet. The new session's own dir is locked while the session lives."""
    ray = fake_ray(0)
    root = tmp_path / "root"
    dead, live, young, other = (root / name for name in (
        "lkray-dead", "lkray-live", "lkray-young", "labkit-run-other"))
    for d in (dead, live, young, other):
        d.mkdir(parents=True)
    _held_by_a_killed_process(dead)
    _held_by_a_killed_process(other)  # not a Ray session: not this sweep's to remove
    owner = rundirs.hold(live)
    try:
        assert session.ensure_ray() is ray
        assert not dead.exists()
        assert live.exists() and young.exists() and other.exists()
        assert not rundirs.is_dead(tmp_path)  # the new session's dir (the fake mkdtemp's)
    finally:
        owner.close()
        if session._state["owner"] is not None:
            session._state["owner"].close()
    assert rundirs.is_dead(tmp_path)


def test_ranks_step_only_once_rays_helpers_have_settled(monkeypatch):
    """Ray Train 2 starts actors beside the workers of every fit (a ``DatasetManager`` that
    imports Ray Data, a ``PreemptionWatcher``): on 2 cores each took half a core for about
    6 s just as the ranks began to step, and lesson 12's 3 ms steps ran 2-5x as long as
    labkit's. A rank now waits while any ``ray::`` process of its own Ray session but the
    train workers is busy (at most ``limit_s``), and the preemption watcher, of no use on one
    machine, is off. Another session's busy helper (another notebook's Ray) is not waited for."""
    import os
    import subprocess
    import sys
    import time

    from labkit.launchers.ray import launcher, session

    assert session.ONE_MACHINE_TRAIN == {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}
    monkeypatch.setenv(session.SESSION_ENV, "lkray-this-test")
    # four spinners beside a busy suite (or a CI run) got under a quarter of a core each
    # here, which read as "settled": a spinner gets a twentieth unless 40 share 2 cores
    monkeypatch.setattr(launcher, "SETTLE_BUSY", 0.05)

    def spin(title: str, mark: str) -> subprocess.Popen:
        env = {**os.environ, session.SESSION_ENV: mark}
        return subprocess.Popen(["bash", "-c", f'exec -a "{title}" {sys.executable} -c '
                                 f'"while True: pass"'], env=env)

    busy = spin("ray::DatasetManager.__init__", "lkray-this-test")
    # a worker Ray is still starting has no ray:: title yet (seen in lesson 12: the
    # DatasetManager's process was busiest then)
    born = spin(f"{sys.executable} /x/site-packages/ray/_private/workers/default_worker.py",
                "lkray-this-test")
    others = [spin("ray::RayTrainWorker", "lkray-this-test"),  # the ranks themselves
              spin("ray::DatasetManager", "lkray-another-notebook")]
    try:
        time.sleep(0.3)
        names = sorted(" ".join(p.cmdline()).split()[0] for p in launcher.ray_helpers())
        assert names == [f"{sys.executable}", "ray::DatasetManager.__init__"], names
        assert launcher.settle_helpers(limit_s=1.2) >= 1.2  # still busy: waited it all
        for p in (busy, born):
            p.kill()
            p.wait()
        assert launcher.settle_helpers(limit_s=5.0) < 2.0  # nothing of ours busy now
    finally:
        for p in [busy, born, *others]:
            p.kill()
            p.wait()
