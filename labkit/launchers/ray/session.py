"""Ray, started the lab's way: once per process, bounded, on loopback, and always shut down.

Ray (Moritz et al. 2018, "Ray: A Distributed Framework for Emerging AI Applications", OSDI)
runs a small cluster of its own processes beside yours: a GCS (the cluster's metadata
store), a raylet per node (scheduler and object store) and worker processes (``ray::...``)
that run tasks and actors. labkit starts that cluster like this (``ensure_ray``):

1. once per Python process (a kernel, a CLI run, a test session); later calls reuse it;
2. with ``num_cpus`` = this machine's cores, so Ray never schedules more than the machine has;
3. without the dashboard and usage statistics, logs in a private temp dir, and every server
   on 127.0.0.1: Ray's own switch for single-machine use (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER
   =0``, what it does on laptops) keeps nothing listening beyond loopback;
4. with ``shutdown_ray`` registered at exit, so no raylet, gcs_server or ``ray::`` worker
   outlives the kernel, the CLI or the test run;
5. tolerant of a busy laptop: Ray's own limits on how long a worker may take to register
   and a node to answer health checks are raised (``BUSY_MACHINE_LIMITS``, unless set
   already), and a start that fails ("The current node timed out during startup": Ray
   waits a fixed 30 s for its raylet) is cleaned up and tried once more; a second failure
   is a ``RayStartFailed`` that names the machine's load.

6. guarded (``labkit.launchers.ray.guard``): a small process started before ``ray.init``
   SIGKILLs every process of the session as soon as this process exits or shuts Ray down,
   however that happens. Without it, a process killed outright (SIGKILL, no atexit) or
   interrupted while Ray starts left Ray's two agents (``ray::DashboardAgent``,
   ``ray::RuntimeEnvAgent``) running for up to a minute after its GCS and raylet died.
7. swept: each session's temp dir (``lkray-*``) is locked by this process while it lives,
   as a supervisor's run directory is (``labkit.launchers.rundirs``); a start first removes
   the dirs whose owner is dead, so the sessions of killed kernels whose guard was killed
   too do not pile up.

With ``RAY_ADDRESS`` set (a cluster you already run), ``ensure_ray`` connects to it instead
and leaves it running at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import IO, Any

from labkit.base import devices
from labkit.base.errors import LabError
from labkit.base.progress import waiting
from labkit.launchers import rundirs

SESSION_ENV = "LABKIT_RAY_SESSION"
"""Set in the driver's environment before ``ray.init``: every Ray process of the session
inherits it, and the guard (``labkit.launchers.ray.guard``) finds them by it."""
GUARD_DIR_ENV = "LABKIT_RAY_GUARD_DIR"
"""The session's temp dir, handed to the guard in its environment: on its command line, the
guard would be one of the processes "naming the session's dir" that shutdown waits for."""

PREFIX = "lkray-"
"""A session's temp dir: ``/tmp/lkray-XXXX`` (Ray's unix sockets under it must fit in 107
bytes: keep it short)."""

_state: dict[str, Any] = {"started": False, "tmp": None, "guard": None, "owner": None}
_RAY_NAMES = ("raylet", "gcs_server")
TRIES = 2
BUSY_MACHINE_LIMITS = {
    "RAY_worker_register_timeout_seconds": "300",  # Ray's default: 60 s per worker start
    "RAY_health_check_timeout_ms": "30000",  # a starved GCS answers late, not never
    "RAY_health_check_failure_threshold": "20",
    "RAY_worker_niceness": "0",  # Ray's default: 15, below every program the student runs
}
"""Ray's own limits (``ray_config_def.h``, set through the environment its processes read),
raised so that a loaded machine is slow rather than failed. Ray starts its workers at nice 15
so that a shared cluster node's daemons stay responsive; on a laptop that puts every actor and
task (Ray Train's controller, a lesson's parameter server) below the browser and the video
call: beside two CPU-bound programs at nice 0 on 2 cores, Ray Train's controller got 7 % of a
core and had not started its ranks after 100 s. At nice 0 Ray's workers share the cores as
the lab's other ranks do."""
ONE_MACHINE_TRAIN = {
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
}
"""Ray Train features a lab on one machine has no use for, off (unless set already). Ray
Train 2 starts a ``PreemptionWatcher`` actor beside the workers of every fit, to notice spot
nodes being taken back; measured here it took half a core for 6 s while the ranks stepped
(docs/benchmarks.md), and a laptop has no node to lose."""
SAY_START_AFTER_S = 2.0
"""A start still going after this many seconds says so (``labkit.base.progress.waiting``)."""
STARTING = "its scheduler, object store and workers; 5-30 s, longer on a busy machine"


class RayStartFailed(LabError):
    """Ray's processes did not come up here (twice); the message names the machine's load."""


def _ray_module() -> Any:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not os.environ.get("RAY_ADDRESS"):
        # loopback only: read by Ray when it is imported, and by the processes it starts
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray
    from ray._private import ray_constants

    if not os.environ.get("RAY_ADDRESS"):
        ray_constants.ENABLE_RAY_CLUSTER = False  # in case ray was imported before us
    return ray


def ensure_ray(num_cpus: int | None = None) -> Any:
    """The ``ray`` module with a running cluster: started here (steps 1-4 above) or reused."""
    ray = _ray_module()
    if ray.is_initialized():
        if not _state["started"] or _raylet_alive(str(_state["tmp"])):
            return ray
        # the raylet we started is gone (killed, out of memory, a SIGTERM Ray's driver
        # handler turned into an exit): every call to this cluster would wait a minute for it,
        # then fail
        shutdown_ray()
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, namespace="labkit", log_to_driver=False)
        return ray
    for var, value in {**BUSY_MACHINE_LIMITS, **ONE_MACHINE_TRAIN}.items():
        os.environ.setdefault(var, value)
    rundirs.sweep(_session_root(), prefix=PREFIX)  # 7.
    with waiting(f"starting Ray ({STARTING})", after_s=SAY_START_AFTER_S):
        tmp, guard, owner = _start(ray, num_cpus)
    if not _state["started"]:
        atexit.register(shutdown_ray)
    _state.update(started=True, tmp=tmp, guard=guard, owner=owner)
    return ray


def _session_root() -> str | None:
    """Where session dirs go: /tmp (short paths), else the temp dir."""
    return "/tmp" if os.path.isdir("/tmp") else None


def _start(ray: Any, num_cpus: int | None) -> tuple[str, subprocess.Popen[bytes], IO[bytes]]:
    """Step 5: ``ray.init`` here, tried ``TRIES`` times under one guard (step 6);
    returns the session's temp dir, its guard and the lock that marks the dir as alive
    (step 7). An interrupt meanwhile stops what started."""

    # one marker and one guard for every try: a failed try's raylet may still start an
    # agent after that try was cleaned up; the guard kills it when this session ends
    mark = uuid.uuid4().hex
    os.environ[SESSION_ENV] = mark  # before ray.init: every Ray process inherits it
    guard = None
    for attempt in range(1, TRIES + 1):
        tmp = tempfile.mkdtemp(prefix=PREFIX, dir=_session_root())
        owner = rundirs.hold(Path(tmp))
        if guard is None:
            guard = _start_guard(mark, tmp)
        else:  # the guard finds this try's processes by its dir too
            _tell_guard(guard, tmp)
        try:
            ray.init(num_cpus=num_cpus or devices.cpu_count(), include_dashboard=False,
                     _temp_dir=tmp, log_to_driver=False, configure_logging=False,
                     namespace="labkit")
            return tmp, guard, owner
        except BaseException as exc:  # Ray raises a plain Exception when its start-up fails
            from labkit.launchers.reaper import interrupts_deferred

            last = attempt == TRIES or not isinstance(exc, Exception)
            with interrupts_deferred():  # a second Ctrl-C waits for the cleanup
                _abandon(tmp, guard if last else None)
                owner.close()
            if not isinstance(exc, Exception):
                raise  # Ctrl-C: stopped, nothing of this start left
            if attempt == TRIES:
                load = os.getloadavg()
                raise RayStartFailed(
                    f"Ray did not start after {TRIES} tries ({exc}); is the machine busy? "
                    f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1 / 5 / 15 "
                    f"min) on {devices.cpu_count()} cores. Close other programs or wait for "
                    f"them, then run the cell again") from exc
    raise AssertionError("unreachable: the last try returns or raises")


def _tell_guard(guard: subprocess.Popen[bytes], path: str) -> None:
    """One more dir for ``guard`` to look in for the session's processes and to remove when
    the driver goes (a line on its stdin; a guard already gone hears nothing)."""
    if guard.stdin is None or guard.stdin.closed:
        return
    with contextlib.suppress(OSError):
        guard.stdin.write(f"{path}\n".encode())
        guard.stdin.flush()


def guard_removes(path: str) -> None:
    """Have this session's guard remove ``path`` when the driver goes, however it goes: a
    driver killed outright runs no ``finally`` (Ray Train's storage of a run, say). Nothing
    where this process did not start Ray (``RAY_ADDRESS``)."""
    if _state["guard"] is not None:
        _tell_guard(_state["guard"], path)


def _start_guard(mark: str, tmp: str) -> subprocess.Popen[bytes]:
    """Step 6: the session's guard, in a session of its own and without the marker."""

    env = {k: v for k, v in os.environ.items() if k != SESSION_ENV}
    env[GUARD_DIR_ENV] = tmp
    return subprocess.Popen([sys.executable, "-m", "labkit.launchers.ray.guard",
                             str(os.getpid()), mark], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                            start_new_session=True)


def _release_guard(guard: subprocess.Popen[bytes] | None, wait_s: float) -> None:
    """Tell the guard Ray is shut down (close its stdin): it kills what is left of the
    session, removes its dir and exits; wait for that (a stuck guard is killed)."""
    if guard is None:
        return
    if guard.stdin is not None:
        guard.stdin.close()
    try:
        guard.wait(wait_s)
    except subprocess.TimeoutExpired:
        guard.kill()
        guard.wait()


def _abandon(tmp: str, guard: subprocess.Popen[bytes] | None = None) -> None:
    """A start that failed or was interrupted: stop whatever of it did start, and remove
    its directory."""
    import ray

    try:
        ray.shutdown()
    except Exception:  # noqa: BLE001 - half-started: nothing more to stop
        pass
    from labkit.launchers.tree import kill_tree

    for pid in _session_pids(tmp):
        kill_tree(pid, include_root=True)
    _release_guard(guard, 15.0)
    shutil.rmtree(tmp, ignore_errors=True)


def shutdown_ray(wait_s: float = 10.0) -> None:
    """Stop the Ray cluster ``ensure_ray`` started and wait until its processes are gone."""
    if not _state["started"]:
        return
    import psutil
    import ray

    session = str(_state["tmp"])
    ours = _session_pids(session)
    ray.shutdown()
    _release_guard(_state["guard"], wait_s + 5.0)  # kills what ray.shutdown left running
    deadline = time.monotonic() + wait_s
    while any(map(psutil.pid_exists, ours)) and time.monotonic() < deadline:
        time.sleep(0.1)
    shutil.rmtree(session, ignore_errors=True)
    if _state["owner"] is not None:
        _state["owner"].close()
    _state.update(started=False, tmp=None, guard=None, owner=None)


def _raylet_alive(session: str) -> bool:
    """Whether the raylet of the session in ``session`` (its temp dir) still runs."""
    return any(name == "raylet" and session in cmd for _, name, cmd, _ in _procs())


def ray_processes() -> list[tuple[int, str]]:
    """Every live Ray process on this machine: (pid, name) of raylets, GCS servers, Ray
    workers (``ray::...``) and Ray's Python helpers (monitor, log monitor, agents)."""
    out = []
    for pid, name, cmd, _ in _procs():
        if (name in _RAY_NAMES or cmd.startswith("ray::") or name.startswith("ray::")
                or "/site-packages/ray/" in cmd):
            out.append((pid, name))
    return out


def _procs() -> list[tuple[int, str, str, int]]:
    """(pid, name, command line, parent pid) of every live, non-zombie process (psutil)."""
    import psutil

    out = []
    for proc in psutil.process_iter(["name", "cmdline", "ppid", "status"]):
        name, cmd, ppid, status = (proc.info[k] for k in ("name", "cmdline", "ppid", "status"))
        if None in (name, cmd, ppid, status):  # exited while being read, or not ours to read
            continue
        if status != psutil.STATUS_ZOMBIE:
            out.append((proc.pid, name, " ".join(cmd), ppid))
    return out


def _session_pids(session: str) -> list[int]:
    """The processes of one Ray session: those naming its temp dir, and their children
    (Ray workers rename themselves ``ray::...`` and name no dir)."""
    procs = _procs()
    ours = {pid for pid, _, cmd, _ in procs if session in cmd}
    return sorted(ours | {pid for pid, _, _, ppid in procs if ppid in ours})
