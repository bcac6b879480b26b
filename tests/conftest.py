"""Shared fixtures: find rank processes this test process started, so tests can prove that
none survive a run (success, failure, timeout or interrupt)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

RANK_ENTRIES = (b"labkit.launchers.rank_main", b"labkit.launchers.pool_main")
"""The modules rank processes run: a fresh run's ranks, a warm pool's ranks."""
FORK_SERVER = b"labkit.launchers.forkserver_main"
"""What this process's fork server runs; every process it forks is a rank."""


def rank_children() -> list[int]:
    """PIDs of live rank processes (fresh or pool ranks) this process started: exec'd ones
    (its children) and forked ones (children of its fork server, ``labkit.launchers.forkserver``)."""
    from labkit.launchers.tree import GONE, processes

    procs = {}
    for pid, (ppid, state) in processes().items():
        try:
            procs[pid] = (ppid, state, Path(f"/proc/{pid}/cmdline").read_bytes())
        except OSError:
            continue
    me = os.getpid()
    servers = {pid for pid, (ppid, _, cmd) in procs.items() if ppid == me and FORK_SERVER in cmd}
    return [pid for pid, (ppid, state, cmd) in procs.items() if state not in GONE and (
        (ppid == me and any(e in cmd for e in RANK_ENTRIES)) or ppid in servers)]


def processes_holding(token: str) -> list[str]:
    """PIDs of processes whose environment contains ``token`` (a test's marker), forked
    ranks included (their environment is the run's ``environ`` file: ``labkit.launchers.reaper``).
    A fork server carries only the variables that configure libraries, never a marker: it
    dies with the process that started it (``test_ranks_die_when_the_parent_is_killed``)."""
    from labkit.launchers.reaper import environ_entries

    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if any(token.encode() in entry for entry in environ_entries(proc)):
                out.append(proc.name)
        except OSError:
            continue
    return out


@pytest.fixture
def no_leftover_ranks():
    """Fails the test if any rank process it started is still alive afterwards."""
    yield
    assert rank_children() == [], "rank processes survived the run"


@pytest.fixture(autouse=True)
def _interruptible():
    """Every test starts with Ctrl-C acting as it does in a student's shell: SIGINT raises
    KeyboardInterrupt in the main thread, and a process the test starts inherits SIGINT's
    default action. A pytest worker, or a library an earlier test ran in it, may have left
    SIGINT ignored (inherited across exec: Python then keeps ignoring it) or handled without
    raising; the interrupt tests then saw their Ctrl-C never acted on in the full suite only.
    The disposition found is put back afterwards."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGINT)
    if before is not signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if before is not signal.default_int_handler and before is not None:
            signal.signal(signal.SIGINT, before)


@pytest.fixture(autouse=True)
def _private_labkit_home(tmp_path_factory, monkeypatch):
    """Quiz progress and other per-user state go to a temp dir, never the real home."""
    monkeypatch.setenv("LABKIT_HOME", str(tmp_path_factory.mktemp("labkit_home")))


@pytest.fixture(scope="session")
def ray_session():
    """Ray started once for every Ray test (about 3 s), shut down at the end of the session;
    fails the session if any Ray process it started (raylet, gcs_server, ray::...) survives.
    Ray's processes inherit this process's environment, so a marker set here finds exactly
    them, whatever else runs Ray on the machine meanwhile (a lesson's kernel, another
    pytest worker)."""
    import time
    import uuid

    from labkit.launchers.ray import ensure_ray, ray_processes, shutdown_ray
    from labkit.launchers.reaper import tagged

    marker = uuid.uuid4().hex
    os.environ["LABKIT_RAY_SESSION_MARK"] = marker
    ray = ensure_ray()
    yield ray
    shutdown_ray()
    deadline = time.monotonic() + 10
    while (left := [(pid, name) for pid, name in ray_processes()
                    if pid in tagged("LABKIT_RAY_SESSION_MARK", marker)]) \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == [], f"Ray processes survived the tests: {left}"


class Contained:
    """A private temp dir and an environment marker every rank (and its descendants)
    inherits, so a test can count what a run left behind without seeing other runs on the
    same machine."""

    def __init__(self, tmpdir: Path, marker: str):
        self.tmpdir, self.marker = tmpdir, marker

    def processes(self) -> list[int]:
        """Live processes started from this test (they carry the marker)."""
        from labkit.launchers.reaper import tagged

        return tagged("LABKIT_TEST_MARK", self.marker)

    def temp_entries(self) -> list[str]:
        """What is in the private temp dir, but torch's per-user compile cache
        (``torchinductor_<user>``, created once by DDP's import and reused by every run)."""
        return sorted(e for e in os.listdir(self.tmpdir) if not e.startswith("torchinductor_"))

    def assert_clean(self) -> None:
        assert self.processes() == [], "processes survived the run"
        assert self.temp_entries() == [], "temp files or dirs survived the run"


@pytest.fixture
def contained(tmp_path_factory, monkeypatch):
    """Runs in this test use a private TMPDIR and carry a marker; after the test, no
    process with the marker and nothing in the temp dir may remain."""
    import tempfile
    import uuid

    tmp = tmp_path_factory.mktemp("runs")
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    marker = uuid.uuid4().hex
    monkeypatch.setenv("LABKIT_TEST_MARK", marker)
    box = Contained(tmp, marker)
    yield box
    box.assert_clean()


SUBREAPER = r"""
import json, os, subprocess, sys, time
from labkit.launchers.tree import become_subreaper, descendants, kill_tree
assert become_subreaper()
kernel = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE,
                          text=True)
out, _ = kernel.communicate(timeout=float(sys.argv[2]))
deadline = time.monotonic() + 15  # what the kernel started may still be exiting
while descendants(os.getpid()) and time.monotonic() < deadline:
    time.sleep(0.1)
left = [[p, open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ").decode()[:120]]
        for p in descendants(os.getpid()) if os.path.exists(f"/proc/{p}")]
kill_tree(os.getpid())
print(json.dumps({"code": kernel.returncode, "out": out, "left": left}))
"""
"""Runs a "kernel" (a script) as the child of a process that is a child subreaper, so every
process the kernel starts -- a daemon that left its group, session and files included --
stays in the wrapper's tree; after the kernel exits it lists what is still alive there."""


def run_in_subreaper(code: str, timeout_s: float = 300.0) -> dict:
    """Run ``code`` as a kernel under a subreaper; {"code", "out", "left": [[pid, cmd]]}:
    what the kernel left behind, counted by process tree, not by name or environment."""
    import json

    proc = subprocess.run([sys.executable, "-c", SUBREAPER, code, str(timeout_s)],
                          capture_output=True, text=True, timeout=timeout_s + 60,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


HOG = ("import os, sys\nparent = int(sys.argv[1])\nos.nice(0)\nn = 0\nwhile True:\n"
       "    n += 1\n    if n % 5_000_000 == 0:  # about a second: gone with the tests\n"
       "        try:\n            os.kill(parent, 0)\n        except ProcessLookupError:\n"
       "            break\n")
"""A CPU-bound process: what a busy laptop runs beside the lab (issue 25, item 7). It stops
by itself within seconds of the test process that started it (``sys.argv[1]``)."""

_SPAWN = ("import subprocess, sys\n"
          "hogs = [subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]],\n"
          "                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,\n"
          "                         stderr=subprocess.DEVNULL, start_new_session=True)\n"
          "        for _ in range(int(sys.argv[3]))]\n"
          "print(' '.join(str(h.pid) for h in hogs))\n")
"""Starts the hogs and exits, so that they are not the test process's descendants: a
quiet check that takes this process tree's own CPU out (``labkit.base.cpuload``: the ranks,
a pool, Ray) must count them as other programs, as it counts a student's browser."""


def start_hogs(n: int = 2) -> list[int]:
    """``n`` CPU-bound processes beside the tests (``LABKIT_TEST_HOGS=2 make test`` starts
    them for the whole session; the ``cpu_hogs`` fixture for one test); their pids."""
    out = subprocess.run([sys.executable, "-c", _SPAWN, HOG, str(os.getpid()), str(n)],
                         check=True, capture_output=True, text=True, timeout=60).stdout
    return [int(pid) for pid in out.split()]


def stop_hogs(hogs: list[int]) -> None:
    """SIGKILL the hogs and wait (10 s at most) until they are gone."""
    import psutil

    procs = []
    for pid in hogs:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(procs, timeout=10)


@pytest.fixture
def cpu_hogs():
    """Two CPU-bound processes running for the length of the test: a busy machine."""
    hogs = start_hogs(2)
    yield hogs
    stop_hogs(hogs)


def pytest_sessionstart(session):
    """``LABKIT_TEST_HOGS=N``: the whole session runs beside N CPU-bound processes, to check
    that no test depends on a quiet machine (docs/developing.md, "A busy machine")."""
    n = int(os.environ.get("LABKIT_TEST_HOGS", "0") or 0)
    if n > 0 and not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller starts them once
        session.config._labkit_hogs = start_hogs(n)


VERDICT_LOGS = Path(__file__).resolve().parents[1] / "artifacts" / "verdicts"
"""The timed verdicts of the last two runs beside hogs: ``hogs-before.jsonl``,
``hogs-last.jsonl`` (``tests.notebooks.claims.flips``)."""


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """``LABKIT_TEST_HOGS=N``: every timed verdict a lesson judges is logged
    (``LABKIT_VERDICT_LOG``, inherited by the workers and the lessons' kernels), and the last
    run's log kept to compare with (``pytest_sessionfinish``)."""
    hogs = int(os.environ.get("LABKIT_TEST_HOGS", "0") or 0)
    if hogs <= 0 or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    from tests.notebooks.claims.verdicts import LOG_ENV  # the claims' imports: only with hogs

    if os.environ.get(LOG_ENV):
        return
    VERDICT_LOGS.mkdir(parents=True, exist_ok=True)
    last = VERDICT_LOGS / "hogs-last.jsonl"
    if last.exists() and last.stat().st_size:
        last.replace(VERDICT_LOGS / "hogs-before.jsonl")
    last.unlink(missing_ok=True)
    os.environ[LOG_ENV] = str(last)
    config._labkit_verdict_log = last


def pytest_sessionfinish(session):
    stop_hogs(getattr(session.config, "_labkit_hogs", []))
    last = getattr(session.config, "_labkit_verdict_log", None)
    if last is None or not last.exists():
        return
    from tests.notebooks.claims.flips import flips, read_log, report

    c = flips(read_log(VERDICT_LOGS / "hogs-before.jsonl"), read_log(last))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and c.compared:
        reporter.ensure_newline()
        reporter.write_sep("-", "timed verdicts beside hogs, against the run before")
        reporter.write_line(report(c))
    if c.flipped:  # a verdict said "holds" in one run and "contradicted" in the other
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# ---- each lesson executed once per suite --------------------------------------------------
def browser_runs_lessons() -> bool:
    """Whether ``tests/browser`` can run here (it then executes every lesson and checks its
    claims in the lesson's kernel): Debian's chromium, Playwright and JupyterLab."""
    import importlib.util

    chromium = os.environ.get("LABKIT_CHROMIUM", "/usr/bin/chromium")
    return Path(chromium).exists() and all(
        importlib.util.find_spec(m) is not None for m in ("playwright", "jupyterlab"))


@pytest.hookimpl(trylast=True)  # after -m / -k deselection: only what will really run counts
def pytest_collection_modifyitems(config, items):
    """A lesson runs once per suite: where its browser test is selected and can run (and
    ``LABKIT_BROWSER_LESSONS`` picks it), the headless run of the same lesson is skipped --
    the browser test checks the same claims, errors, stderr boxes and Ray leftovers. Without a
    browser, or with ``-m "not browser"``, the headless test runs it."""
    if not browser_runs_lessons():
        return
    wanted = [w.strip() for w in os.environ.get("LABKIT_BROWSER_LESSONS", "").split(",")
              if w.strip()]
    in_browser = {item.callspec.params["path"].stem for item in items
                  if item.nodeid.startswith("tests/browser/") and hasattr(item, "callspec")}
    in_browser = {s for s in in_browser
                  if not wanted or any(s == w or s.startswith(w + "_") for w in wanted)}
    for item in items:
        if item.name.startswith("test_notebook_runs_top_to_bottom[") and \
                item.callspec.params["path"].stem in in_browser:
            item.add_marker(pytest.mark.skip(
                reason="executed once, in JupyterLab: tests/browser checks its claims"))


# ---- running the suite on two workers (pytest-xdist, `make test`) -----------------------
XDIST_GROUPS = {
    "cluster": ("tests/distributed/test_cluster.py", "tests/distributed/test_torchrun.py",
                "tests/distributed/test_elastic.py",
                "test_notebook_runs_top_to_bottom[10_multi_node]",
                "test_lesson_renders_in_jupyterlab[10_multi_node]"),
    "ray": ("tests/distributed/test_ray.py", "tests/distributed/test_ray_interrupts.py",
            "tests/unit/test_ray_guard.py", "test_notebook_runs_top_to_bottom[12_ray]",
            "test_lesson_renders_in_jupyterlab[12_ray]"),
}
"""Tests that share machine-wide state run on one worker, one after another: emulated
clusters and torchrun (their leftover checks count every labkit namespace and cluster
process on the host; lesson 10 among them) and Ray (one cluster at a time; lesson 12 among
them). Every other test -- each other lesson, headless or in the browser, included: a worker
starts its own JupyterLab for the lessons it gets -- is its own unit of work. The grading
tests are too: each worker grades in a course copy of its own (the session's ``root``), each
test as a student of its own, and what they check for leftovers is their own (processes
holding the test's token, box cgroups whose grader is gone)."""


def xdist_group_of(nodeid: str) -> str | None:
    for group, keys in XDIST_GROUPS.items():
        if any(nodeid.startswith(k) or nodeid.endswith(k) for k in keys):
            return group
    return None


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` by ``XDIST_GROUPS``, decided from node ids in the controller.

    (pytest-xdist's own loadgroup reads ``xdist_group`` marks through a node-id suffix that
    pytest 9.2's structured node ids silently drop -- pytest-xdist issue #1386 -- so the
    groups are applied here instead, whatever the pytest version.) Work units go out
    largest first (the groups), then one test at a time."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group_of(nodeid.split("@", 1)[0]) or nodeid

    return GroupScheduling(config, log)
