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
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from labkit.base.errors import LabError
from labkit.grading.sandbox.modes import (
    available,
    bwrap_cmd,
    env,
    package_parent,
    resolve_mode,
    unshare_cmd,
)

MAX_REPLY = 64 * 2**20
__all__ = ["Box", "BoxError", "BoxTimeout", "available", "resolve_mode"]


class BoxError(LabError):
    """The box died, broke the protocol, or could not start."""


class BoxTimeout(BoxError):
    """The box did not answer within the time limit (it has been killed)."""


def _is_namespace_init(pid: int) -> bool:
    """Is ``pid`` still the first process of a pid namespace (not a recycled pid)?"""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    nspid = next((line.split()[1:] for line in status.splitlines()
                  if line.startswith("NSpid:")), [])
    return len(nspid) > 1 and nspid[-1] == "1"


class Box:
    """One running box: start it, send requests with a deadline, read the loopback bytes."""

    def __init__(self, *, mode: str | None = None, course_root: Path | None = None,
                 files: Mapping[str, bytes] | None = None):
        self.mode = resolve_mode(mode)
        self.course_root = course_root
        self.files = dict(files or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.netns_pid: int | None = None
        self._buffer = b""
        self._stderr: list[bytes] = []
        self._counter = 0
        self._private: str | None = None

    # ---- life cycle ---------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> Box:
        to_box_r, to_box_w = os.pipe()
        from_box_r, from_box_w = os.pipe()
        server = [sys.executable, "-m", "labkit.grading.sandbox.server", str(to_box_r),
                  str(from_box_w)]
        fds = [to_box_r, from_box_w]
        info_r = info_w = -1
        if self.mode == "bwrap":
            info_r, info_w = os.pipe()
            fds.append(info_w)
            cmd = bwrap_cmd(env({}, "/tmp/home", "/tmp"), info_w) + server
            variables, cwd = None, None
        elif self.mode == "unshare":
            cmd = unshare_cmd(self.course_root) + server
            variables = env({"LABKIT_BOX_LO_UP": "1", "PYTHONPATH": package_parent()},
                            "/tmp/home", "/tmp")
            cwd = "/"
        else:
            self._private = tempfile.mkdtemp(prefix="labkit-box-")
            Path(self._private, "home").mkdir()
            variables = env({"PYTHONPATH": package_parent()}, f"{self._private}/home",
                            self._private)
            cmd, cwd = server, self._private
        self.proc = subprocess.Popen(cmd, pass_fds=fds, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     env=variables, cwd=cwd, start_new_session=True)
        for fd in fds:
            os.close(fd)
        self._to, self._from = to_box_w, from_box_r
        threading.Thread(target=self._drain, daemon=True).start()
        self.netns_pid = self.proc.pid if self.mode == "unshare" else None
        if info_r >= 0:
            self.netns_pid = self._child_pid(info_r, timeout)
        files = {k: base64.b64encode(v).decode() for k, v in self.files.items()}
        self.request("init", timeout, files=files)
        return self

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
        for chunk in iter(lambda: self.proc.stderr.read(4096), b""):  # type: ignore[union-attr]
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
        targets = []
        if self.proc.poll() is None:
            if self.mode == "bwrap" and self.netns_pid and _is_namespace_init(self.netns_pid):
                targets.append(self.netns_pid)  # the pid namespace's init: its death ends it
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
        for fd in (self._to, self._from):
            try:
                os.close(fd)
            except OSError:
                pass
        if self._private:
            shutil.rmtree(self._private, ignore_errors=True)
        self.proc = None

    def __enter__(self) -> Box:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- requests -----------------------------------------------------------------------
    def request(self, op: str, timeout: float, **payload: Any) -> dict[str, Any]:
        """Send one request; the reply, or BoxTimeout (box killed) / BoxError."""
        if not self.alive():
            raise BoxError(f"the box is not running; its last words: {self.stderr_tail()}")
        self._counter += 1
        rid, token = self._counter, secrets.token_hex(8)
        soft = payload.pop("limit", None)
        message = {"op": op, "id": rid, "token": token, **payload}
        if soft is not None:
            message["timeout"] = soft
        try:
            os.write(self._to, (json.dumps(message) + "\n").encode())
        except OSError as exc:
            raise BoxError(f"could not reach the box: {exc}") from None
        deadline = time.monotonic() + timeout
        while True:
            line = self._read_line(deadline)
            try:
                reply = json.loads(line)
            except ValueError:
                continue  # not a reply of ours (student output written to the pipe)
            if isinstance(reply, dict) and reply.get("id") == rid and reply.get("token") == token:
                return reply

    def _read_line(self, deadline: float) -> bytes:
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            ready = select.select([self._from], [], [], max(0.0, remaining))[0] \
                if remaining > 0 else []
            if not ready:
                self.stop()
                raise BoxTimeout("no answer before the time limit")
            chunk = os.read(self._from, 1 << 20)
            if not chunk:
                tail = self.stderr_tail()
                self.stop()
                raise BoxError(f"the box exited{': ' + tail if tail else ''}")
            self._buffer += chunk
            if len(self._buffer) > MAX_REPLY:
                self.stop()
                raise BoxError(f"the box sent more than {MAX_REPLY} bytes in one reply")
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def loopback_tx_bytes(self) -> int | None:
        """Bytes sent on the box's own loopback so far (None where there is no netns)."""
        if self.netns_pid is None:
            return None
        try:
            text = Path(f"/proc/{self.netns_pid}/net/dev").read_text()
        except OSError:
            return None
        for row in text.splitlines():
            name, _, counters = row.partition(":")
            if name.strip() == "lo":
                return int(counters.split()[8])
        return None
