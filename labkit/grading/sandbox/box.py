"""The box a student's notebook runs in while it is graded, and the pipe to it.

nbgrader runs student code with the grader's rights and says so in its own documentation;
labkit grades in a box instead. Three modes, best first (``auto`` picks the first that
works on this machine; ``LABKIT_SANDBOX`` or ``SandboxedExecute.sandbox`` force one):

``bwrap`` (Debian's ``bubblewrap``)
    a new root built from read-only binds of only what Python needs (``/usr``, a few
    files of ``/etc``, the interpreter, the virtual environment, the ``labkit`` package);
    fresh ``/tmp``, ``/proc`` and ``/dev``; new user (uid 65534, no capabilities), pid,
    network, IPC and UTS namespaces; ``--die-with-parent``. The course folder
    (``solutions/``, ``course/gradebook.db``, other students' work, ``nbgrader_config.py``,
    ``.git``) does not exist in the box. The network namespace has only a loopback
    interface (up: gloo ranks talk over it), so nothing leaves the machine.
``unshare`` (util-linux, when bubblewrap is missing)
    new user, mount, pid, network, IPC and UTS namespaces; every mount is remounted
    read-only, ``/tmp`` is fresh, and the course folder's entries and the home folder's
    are hidden under empty mounts, loopback is brought up. NOT protected: the rest of the
    file system stays readable (read-only), as the grading user could read it.
``none`` (no namespaces available, e.g. macOS)
    a plain child process in its own session with a scrubbed environment and a private
    working folder. NOT protected: it can read and write whatever the grading user can,
    and a process that leaves the session can outlive grading. The checks still run
    outside the student's interpreter, so patching the grader or walking the stack to
    its variables still earns nothing.

In every mode the box gets the submission's data files over the pipe (never a writable
mount of the course), and dies with the grading: killing ``bwrap`` / ``unshare`` kills
the pid namespace's first process, and the kernel then kills everything left inside.

What the box may use (:mod:`limits`): its own cgroup where the grader may make one, the
rlimits its first process (:mod:`boxinit`) sets inside, a sized ``/tmp``; its CPU time is
read from outside (:mod:`procfs`) while it works, and :meth:`Box.hits` says which limit
stopped something. ``bwrap`` and ``unshare`` themselves start with an empty environment,
and the box's first process is labkit's own non-dumpable init, so no process in the box
holds the grader's environment or can be traced by the student's code. ``absent`` names
labkit modules the box must not contain (:mod:`absent`).
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from labkit.grading.sandbox import procfs, seccomp
from labkit.grading.sandbox.limits import BoxCgroup, Limits, apply_rlimits, enter_cgroup
from labkit.grading.sandbox.modes import (
    BOX_PACKAGE,
    available,
    bwrap_cmd,
    drop_capabilities,
    env,
    init_argv,
    package_dir,
    package_parent,
    resolve_mode,
    tool_env,
    unshare_cmd,
)
from labkit.grading.sandbox.pipe import POLL_S, BoxError, BoxLimit, BoxTimeout, Pipe

__all__ = ["POLL_S", "Box", "BoxError", "BoxLimit", "BoxTimeout", "available", "resolve_mode"]


class Box(Pipe):
    """One running box: start it, exchange JSON messages with deadlines, watch its use."""

    def __init__(self, *, mode: str | None = None, course_root: Path | None = None,
                 files: Mapping[str, bytes] | None = None, limits: Limits | None = None,
                 absent: Sequence[str] = (), cgroup_parent: str | None = None,
                 network: bool = True, server: str = "labkit.grading.sandbox.server"):
        super().__init__()
        self.mode = resolve_mode(mode)
        self.course_root = course_root
        self.files = dict(files or {})
        self.limits = limits or Limits()
        self.absent = tuple(absent)
        self.cgroup_parent, self.network, self.server = cgroup_parent, network, server
        self.proc: subprocess.Popen[bytes] | None = None
        self.init_pid: int | None = None
        self.cgroup: BoxCgroup | None = None
        self._cpu_done = 0.0  # CPU seconds of this box's earlier lives (before a restart)
        self._cpu_now = 0.0  # of its current life, at the last reading
        self.tasks = 0  # processes and threads at the last reading
        self._last_hits: dict[str, int] = {"pids": 0, "memory": 0, "oom": 0, "tmp_full": 0}
        self._stderr: list[bytes] = []
        self._private: str | None = None

    # ---- life cycle ---------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> Box:
        Pipe.__init__(self)
        self.init_pid = None
        self._cpu_done, self._cpu_now = self.cpu_s, 0.0  # a restart counts from zero again
        to_box_r, to_box_w = os.pipe()
        from_box_r, from_box_w = os.pipe()
        fds = [to_box_r, from_box_w]
        info_r = info_w = -1
        self.cgroup = BoxCgroup.make(self.limits, self.cgroup_parent)
        cgroup_files = self.cgroup.procs_files if self.cgroup else []
        rlimits: dict[str, int] = {}
        if self.mode == "bwrap":
            info_r, info_w = os.pipe()
            fds.append(info_w)
            server = init_argv(self.limits, BOX_PACKAGE, self._server_argv(to_box_r, from_box_w))
            cmd = bwrap_cmd(env({}, "/tmp/home", "/tmp"), info_w, self.limits, self.absent,
                            self.network) + server
            variables, cwd = tool_env(), None
        elif self.mode == "unshare":
            server = init_argv(self.limits, str(package_dir()),
                               drop_capabilities(self._server_argv(to_box_r, from_box_w)))
            cmd = unshare_cmd(self.course_root, self.limits, self.absent) + server
            variables = env({"LABKIT_BOX_LO_UP": "1" if self.network else "0",
                             "PYTHONPATH": package_parent()}, "/tmp/home", "/tmp")
            cwd = "/"
        else:
            self._private = tempfile.mkdtemp(prefix="labkit-box-")
            Path(self._private, "home").mkdir()
            variables = env({"PYTHONPATH": package_parent()}, f"{self._private}/home",
                            self._private)
            cmd, cwd = self._server_argv(to_box_r, from_box_w), self._private
            # no user namespace here: RLIMIT_NPROC counts every process of this user
            rlimits = dict(self.limits.rlimits(), NPROC=self.limits.processes + procfs.user_tasks())

        def prepare() -> None:  # between fork and exec: only system calls
            enter_cgroup(cgroup_files)
            apply_rlimits(rlimits)
            if self.mode == "none":  # the other modes' first process (boxinit) installs it
                seccomp.install()

        try:
            self.proc = subprocess.Popen(cmd, pass_fds=fds, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                         env=variables, cwd=cwd, start_new_session=True,
                                         preexec_fn=prepare)
        except BaseException:
            for fd in (*fds, to_box_w, from_box_r, info_r):
                if fd >= 0:
                    os.close(fd)
            self._remove_cgroup()
            raise
        for fd in fds:
            os.close(fd)
        self._to, self._from = to_box_w, from_box_r
        threading.Thread(target=self._drain, daemon=True).start()
        if info_r >= 0:
            self.init_pid = self._child_pid(info_r, timeout)
        elif self.mode == "unshare":
            deadline = time.monotonic() + 5
            while self.init_pid is None and time.monotonic() < deadline and self.alive():
                self.init_pid = procfs.first_child(self.proc.pid)
                time.sleep(0.01 if self.init_pid is None else 0)
        files = {k: base64.b64encode(v).decode() for k, v in self.files.items()}
        self.request("init", timeout, files=files)
        return self

    def _server_argv(self, rfd: int, wfd: int) -> list[str]:
        return [sys.executable, "-m", self.server, str(rfd), str(wfd)]

    def _child_pid(self, fd: int, timeout: float) -> int | None:
        """The sandbox's first process, from bwrap's --info-fd JSON.

        Read to EOF: bwrap writes the JSON in pieces and closes the fd when done. Closing
        our end early would kill bwrap with SIGPIPE half-way through setting up the
        namespaces and leave its child waiting forever.
        """
        data, deadline = b"", time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                    break
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                data += chunk
        finally:
            os.close(fd)
        try:
            return int(json.loads(data.decode())["child-pid"])
        except (ValueError, KeyError):
            return None

    def _drain(self) -> None:
        """Keep the last 20 kB of the box's own stderr (start-up failures, crashes)."""
        assert self.proc is not None and self.proc.stderr is not None
        stream = self.proc.stderr  # stop() drops self.proc while this may still read
        for chunk in iter(lambda: stream.read(4096), b""):
            self._stderr.append(chunk)
            while sum(map(len, self._stderr)) > 20_000:
                self._stderr.pop(0)

    def stderr_tail(self) -> str:
        return b"".join(self._stderr).decode(errors="replace")[-4000:]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """Kill the box and everything in it (pid namespace, or the session in mode none)."""
        if self.proc is None:
            return
        self.usage()  # the last reading: what the box used in all
        tmp = self.hits().get("tmp_full", 0)  # /tmp is gone once its first process is
        targets = []
        if self.proc.poll() is None:
            if self.init_pid and procfs.is_namespace_init(self.init_pid):
                targets.append(self.init_pid)  # the pid namespace's init: its death ends it
            targets.append(self.proc.pid)
        for pid in targets:
            try:
                if self.mode == "none":
                    os.killpg(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.proc.wait()
        self._last_hits = dict(self.hits(), tmp_full=tmp)  # the cgroup's counters go with it
        for fd in (self._to, self._from):
            try:
                os.close(fd)
            except OSError:
                pass
        if self._private:
            shutil.rmtree(self._private, ignore_errors=True)
        self._remove_cgroup()
        self.proc = None

    def _remove_cgroup(self) -> None:
        if self.cgroup is not None:
            if self.mode == "none":  # no pid namespace took the stragglers along
                for pid in self.cgroup.pids():
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
            self.cgroup.remove()

    def __enter__(self) -> Box:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- what the box uses ----------------------------------------------------------------
    @property
    def cpu_s(self) -> float:
        """CPU seconds the box used so far, over all its lives (last reading)."""
        return self._cpu_done + self._cpu_now

    def usage(self, now: procfs.Table | None = None) -> procfs.Usage:
        """CPU seconds and tasks of the whole box now (``now``: a reading to share)."""
        if self.proc is None:
            return procfs.Usage(self.cpu_s)
        reading = procfs.usage(self.proc.pid, now)
        self._cpu_now = max(self._cpu_now, reading.cpu_s)
        self.tasks = reading.tasks
        return reading

    def hits(self) -> dict[str, int]:
        """Counters of limits the box ran into: ``pids`` / ``memory`` / ``oom`` (cgroup) and
        ``tmp_full`` (1 when /tmp is at least 98 % full); a stopped box keeps its last ones."""
        if self.proc is None:
            return dict(self._last_hits)
        out = self.cgroup.events() if self.cgroup is not None else {"pids": 0, "memory": 0,
                                                                    "oom": 0}
        tmp = procfs.tmp_used(self.init_pid)
        out["tmp_full"] = int(tmp is not None and tmp[1] > 0 and tmp[0] >= 0.98 * tmp[1])
        return out
