"""Ranks forked from a warm fork server: a run starts in a fraction of a second.

Teaches: where a distributed run's start-up goes, and the classic fix. A fresh rank is a new
Python that imports torch (about 1 s of CPU on a laptop core) and, as soon as it builds an
optimizer or a ``DistributedDataParallel``, ``torch._dynamo`` (about 1.3 s more) -- before
its first step, for every rank of every run. Four ranks on two cores: five seconds of
waiting for a one-second lesson. The fix is the one Python's own ``multiprocessing``
"forkserver" start method (with ``set_forkserver_preload``) and Android's zygote use: one
process imports everything once and ``fork()``s a copy for each rank, which shares those
pages copy-on-write (``labkit.launchers.forkserver_main``).

A forked rank keeps every promise of an exec'd one (``labkit.launchers.supervisor``):

1. *Same rank code.* It runs the same ``labkit.launchers.rank_main`` / ``labkit.launchers.pool_main`` with the
   same arguments, file descriptors at the same numbers, the caller's working directory and
   the caller's whole environment *as of this run* (set in the child before anything runs).
   The server imports the libraries with only the variables that configure them
   (``server_env``), so a test's marker or a run's temp dir never sticks to the server.
2. *Same ownership.* Each rank leads its own process group; the server reaps a rank only
   when the supervisor asks (``ForkedRank.wait``), so the supervisor may signal the group
   exactly as it does a child of its own. A supervisor that is done -- or gone -- has the
   server kill and reap whatever it still owned (``Client.close``).
3. *Same cleanup.* A forked process shows the *server's* environment in
   ``/proc/PID/environ`` (Linux keeps the copy made at ``exec``), so the run's tag is also
   written to the run directory's ``environ`` file, which every rank holds open and every
   fork inherits; ``labkit.launchers.reaper.tagged`` reads it there. Ranks still die with the caller:
   the server dies with it (PR_SET_PDEATHSIG, or end of file on its control socket), and
   each rank dies with the server.

One server per set of library-configuring variables, started on first use and kept for the
life of the process (a notebook kernel keeps its own). ``LABKIT_FORKSERVER=0`` turns it
off: ranks are then exec'd as plain subprocesses, as before. If the server cannot start,
labkit says why once and falls back to that too. Linux only, like the rest of the
supervisor. Not used by torchrun, Ray or emulated nodes, which start their own processes.
"""

from __future__ import annotations

import atexit
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import warnings
from typing import Any

from labkit.launchers.forkserver_main import recv, send
from labkit.launchers.reaper import FORKSERVER_ENV

SWITCH_ENV = "LABKIT_FORKSERVER"
"""Set to 0 to exec every rank as a plain subprocess instead."""
READY_TIMEOUT_S = 120.0
CONFIGURING = ("PYTHON", "TORCH", "PYTORCH", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "GOTO",
               "CUDA", "NCCL_", "GLOO_", "NVIDIA_", "LD_", "LC_", "LANG", "PATH", "HOME",
               "LABKIT_FORKSERVER_PRELOAD")
"""Prefixes of the variables a library may read while it is imported: the server's environment."""


def enabled() -> bool:
    return os.environ.get(SWITCH_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def server_env(env: dict[str, str]) -> dict[str, str]:
    """The variables the server imports the libraries with (see ``CONFIGURING``)."""
    return {k: v for k, v in env.items() if k.startswith(CONFIGURING)}


class ForkedRank:
    """A rank forked by the server: what the supervisor uses of ``subprocess.Popen``."""

    def __init__(self, pid: int, client: Client):
        self.pid, self.client = pid, client
        self.returncode: int | None = None
        self.pidfd = os.pidfd_open(pid)

    def exited(self) -> bool:
        """Whether it has exited (it stays unreaped: its group id cannot be reused yet)."""
        if self.returncode is not None:
            return True
        return bool(select.select([self.pidfd], [], [], 0)[0])

    def poll(self) -> int | None:
        """The exit code if it has exited (reaping it), else None -- as ``Popen.poll``."""
        return self.wait(0) if self.exited() else None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        if not select.select([self.pidfd], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired(f"rank {self.pid}", timeout or 0.0)
        code = self.client.reap(self.pid)
        self.returncode = -signal.SIGKILL if code is None else code  # None: the server died
        os.close(self.pidfd)
        return self.returncode


class Client:
    """One supervisor's connection to the server: ``spawn`` ranks, ``reap`` them, ``close``."""

    def __init__(self, sock: socket.socket, server: ForkServer):
        self.sock, self.server = sock, server
        self.lock = threading.Lock()

    def _ask(self, message: dict[str, Any], fds: tuple[int, ...] = ()) -> dict[str, Any] | None:
        """One request and its answer; None when the server is gone."""
        with self.lock:
            try:
                send(self.sock, message, fds)
                answer, _ = recv(self.sock)
            except OSError:
                return None
        return answer  # type: ignore[no-any-return]

    def spawn(self, module: str, args: list[str], *, environ_file: str, stdout: int,
              pass_fds: tuple[int, ...]) -> ForkedRank:
        """Fork ``python -m MODULE ARGS`` (as the server's child) with the environment held in
        ``environ_file`` (``labkit.launchers.reaper.ENVIRON_FILE``) and this process's working
        directory. Call it with Ctrl-C held back (``reaper.interrupts_deferred``, as the
        supervisor does) until the rank is recorded, or an interrupt could leave it unseen."""
        answer = self._ask({"op": "spawn", "module": module, "args": args, "cwd": os.getcwd(),
                            "pass_fds": list(pass_fds), "environ_file": environ_file},
                           (stdout, *pass_fds))
        if answer is None:
            raise OSError("the fork server is gone")
        if "pid" not in answer:
            raise OSError(answer.get("errno", 0), answer.get("error", "fork failed"))
        return ForkedRank(answer["pid"], self)

    def reap(self, pid: int) -> int | None:
        answer = self._ask({"op": "reap", "pid": pid})
        return None if answer is None else answer.get("code")

    def close(self) -> None:
        """The server kills and reaps whatever this client still owns, then we hang up."""
        self._ask({"op": "close"})
        self.sock.close()
        with self.server.lock:
            self.server.clients -= 1


class ForkServer:
    """The server process and its control socket (``labkit.launchers.forkserver_main``)."""

    def __init__(self, env: dict[str, str]):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # PR_SET_PDEATHSIG fires when the starting *thread* exits: arm it only from main
        main_thread = threading.current_thread() is threading.main_thread()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "labkit.launchers.forkserver_main", str(theirs.fileno()),
                 "1" if main_thread else "0"],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                start_new_session=True)
        finally:
            theirs.close()
        self.control = ours
        self.lock = threading.Lock()
        self.ready = False
        self.owner = os.getpid()
        """The process that started it: a forked copy of that process must not use it."""
        self.clients = 0
        """Supervisors connected now; an older server is closed once it has none."""

    def wait_ready(self) -> None:
        """Block until the imports are done (the first run pays them once)."""
        if self.ready:
            return
        with self.lock:
            if self.ready:
                return
            if not select.select([self.control], [], [], READY_TIMEOUT_S)[0]:
                raise OSError(f"the fork server was not ready after {READY_TIMEOUT_S:g} s")
            answer, _ = recv(self.control)
            if answer is None or "ready" not in answer:
                detail = (answer or {}).get("error") or f"it exited with {self.proc.wait()}"
                raise OSError(f"the fork server could not start: {detail}")
            self.ready = True

    def alive(self) -> bool:
        return self.proc.poll() is None

    def connect(self) -> Client:
        """A new client socket, handed to the server over the control socket."""
        self.wait_ready()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with self.lock:
                send(self.control, {"op": "client"}, (theirs.fileno(),))
                self.clients += 1
        finally:
            theirs.close()
        return Client(ours, self)

    def close(self) -> None:
        """End of file on the control socket: the server kills its ranks and exits."""
        self.control.close()
        if self.owner != os.getpid():
            return  # a forked copy of the caller: the server is the original's to stop
        try:
            self.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_servers: dict[tuple[Any, ...], ForkServer] = {}
_lock = threading.Lock()
_broken: list[str] = []


def server_pid() -> int | None:
    """The pid of this process's running fork server (the newest, if several), or None."""
    with _lock:
        live = [s.proc.pid for s in _servers.values() if s.owner == os.getpid() and s.alive()]
    return live[-1] if live else None


def connect(env: dict[str, str]) -> Client | None:
    """A client of this process's server for ``env`` (started on first use), or None when
    the fork server is off or could not start here (the caller then execs its ranks)."""
    if not enabled() or _broken:
        return None
    wanted = server_env(env)
    wanted[FORKSERVER_ENV] = str(os.getpid())  # also makes the key this process's
    key = (sys.executable, tuple(sorted(wanted.items())))
    for _ in range(2):  # a server that served before and died since is replaced once
        server, served_before = None, False
        try:
            with _lock:
                server = _servers.get(key)
                if server is None or not server.alive():
                    idle = [k for k, s in _servers.items() if s.clients == 0]
                    for old in [_servers.pop(k) for k in idle]:  # one warm server at a time
                        old.close()
                    server = None
                    server = _servers[key] = ForkServer(wanted)
            served_before = server.ready
            return server.connect()
        except OSError as exc:
            with _lock:
                _servers.pop(key, None)
            if server is not None:
                server.close()
            if not served_before:  # it never started: say why once, then exec ranks
                _broken.append(str(exc))
                warnings.warn(f"labkit's fork server is off for this process ({exc}); ranks "
                              f"start as plain subprocesses, a few seconds slower each",
                              stacklevel=3)
                return None
    return None


@atexit.register
def close_all() -> None:
    """Stop every server this process started (at exit; tests call it to start afresh)."""
    with _lock:
        servers = list(_servers.values())
        _servers.clear()
    for server in servers:
        server.close()
    _broken.clear()

