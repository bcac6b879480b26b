"""The fork server process: ``python -m labkit.launchers.forkserver_main CONTROL_FD DIE_WITH_PARENT``.

It imports torch (and ``torch._dynamo``, which every optimizer and DDP pull in) ONCE, then
forks a rank for every request, so a rank starts in milliseconds instead of paying those
imports again (about 2.4 s of CPU per rank on a laptop core). The parent side, and why it
keeps every promise of a freshly exec'd rank, is ``labkit.launchers.forkserver``. The steps:

1. leave Ctrl-C to the caller; become a child subreaper (``labkit.launchers.tree``), so
   whatever outlives a rank -- a daemon it started, double fork and all -- is re-parented
   here and killed at once; die with the caller, but not before every rank and everything
   they started is dead (PR_SET_PDEATHSIG with SIGTERM when it was started from the
   caller's main thread; in every case end of file on the control socket means the caller
   is gone);
2. import ``PRELOAD`` and check that this process is still single-threaded in Python
   (forking a process with Python threads can copy a held lock), then say ``ready``;
3. serve: the control socket hands over one socket per client (a ``Supervisor``); on a
   client's socket, ``spawn`` forks a rank (step 4) and answers its pid, ``reap`` collects
   the exit code of a rank the client saw exit, ``close`` kills and reaps what the client
   still owns. A client that vanishes is closed the same way; the end of the control socket
   ends everything. Every round, and before answering ``close``, any child that is not a
   rank (an orphan come back to this subreaper) is killed with its subtree and reaped;
4. in the child: a new session (its own process group, as ``start_new_session``), the
   client's file descriptors at the numbers the client gave them (as ``pass_fds``), its
   output to the rank's log, the caller's working directory, the caller's whole environment
   read from the run's environment file (which it keeps open: ``labkit.launchers.reaper`` reads it
   there), then the rank's module's ``main(args)``; the child never returns into this loop.

The server reaps a rank only when asked (or when its client is gone), so until then the
rank's pid -- and its process group id -- cannot be reused: the caller may signal the group
as it would a child of its own.
"""

from __future__ import annotations

import fcntl
import importlib
import os
import pickle
import selectors
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any

from labkit.launchers.tree import become_subreaper, children_of, kill_tree

PRELOAD = ("numpy", "cloudpickle", "torch", "torch.distributed", "torch._dynamo",
           "torch.nn.parallel", "labkit.rank.context", "labkit.rank.group", "labkit.trace.comm",
           "labkit.trace.tracer", "labkit.train.loop", "labkit.train.training", "labkit.launchers.rank_main",
           "labkit.launchers.pool_main")
"""What every rank imports anyway: imported once here, shared by every fork."""
PRELOAD_ENV = "LABKIT_FORKSERVER_PRELOAD"
"""More modules to import once for every rank, comma-separated (say, your own model code)."""
MAX_MESSAGE = 1 << 20
MAX_FDS = 16
STOP_S = 5.0
"""How long a stopping server keeps killing what comes back to it."""


class Stop(BaseException):
    """SIGTERM (the caller died): leave the loop, whatever it was doing, and stop."""


def _on_term(_signum: int, _frame: Any) -> None:
    raise Stop


def recv(sock: socket.socket) -> tuple[Any, list[int]]:
    """One message and the file descriptors that came with it; (None, []) at end of file."""
    data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return pickle.loads(data), fds


def send(sock: socket.socket, message: Any, fds: list[int] | tuple[int, ...] = ()) -> None:
    socket.send_fds(sock, [pickle.dumps(message)], list(fds))


class Server:
    """Step 3: the loop, and which client owns which rank."""

    def __init__(self, control: socket.socket):
        self.control = control
        self.selector = selectors.DefaultSelector()
        self.selector.register(control, selectors.EVENT_READ)
        self.owned: dict[socket.socket, set[int]] = {}
        self.orphans: set[int] = set()
        """Killed ranks of closed clients, reaped as soon as they are zombies."""

    def serve(self) -> None:
        while True:
            for key, _ in self.selector.select(timeout=1.0):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    message, fds = recv(sock)
                except OSError:
                    message, fds = None, []
                if sock is self.control:
                    if message is None:
                        self.stop()
                    for fd in fds:  # a new client's socket
                        client = socket.socket(fileno=fd)
                        self.owned[client] = set()
                        self.selector.register(client, selectors.EVENT_READ)
                elif message is None:
                    self.close_client(sock)
                else:
                    self.answer(sock, message, fds)
            self.kill_strays()
            self.reap_orphans()

    def answer(self, sock: socket.socket, message: dict[str, Any], fds: list[int]) -> None:
        op = message.get("op")
        try:
            if op == "spawn":
                reply = self.spawn(sock, message, fds)
            elif op == "reap":
                reply = {"code": self.reap(sock, message["pid"])}
            elif op == "close":
                self.kill_and_reap(self.owned.get(sock, set()))
                self.owned[sock] = set()
                self.kill_strays(wait_s=2.0)  # what the ranks left came back to us
                reply = {"closed": True}
            else:
                reply = {"error": f"unknown request {op!r}"}
        except Exception as exc:  # noqa: BLE001 - one bad request must not end the server
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            send(sock, reply)
        except OSError:
            self.close_client(sock)

    def spawn(self, sock: socket.socket, message: dict[str, Any], fds: list[int]
              ) -> dict[str, Any]:
        try:
            pid = os.fork()
        except OSError as exc:
            for fd in fds:
                os.close(fd)
            return {"errno": exc.errno, "error": str(exc)}
        if pid == 0:
            become_rank(message, fds, [self.control, *self.owned], self.selector)
        for fd in fds:
            os.close(fd)
        self.owned[sock].add(pid)
        return {"pid": pid}

    def reap(self, sock: socket.socket, pid: int) -> int | None:
        """The exit code (negative: the signal) of an exited rank, or None if it still runs."""
        if pid not in self.owned.get(sock, ()):
            return None
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == 0:
            return None
        self.owned[sock].discard(pid)
        return os.waitstatus_to_exitcode(status)

    def kill_and_reap(self, pids: set[int]) -> None:
        """SIGKILL each rank's group (before its leader is reaped), then reap what died."""
        for pid in pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.orphans |= pids
        self.reap_orphans(wait_s=2.0)

    def reap_orphans(self, wait_s: float = 0.0) -> None:
        deadline = time.monotonic() + wait_s
        while self.orphans:
            for pid in list(self.orphans):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done = pid
                if done:
                    self.orphans.discard(pid)
            if not self.orphans or time.monotonic() >= deadline:
                return
            time.sleep(0.01)

    def kill_strays(self, wait_s: float = 0.0) -> None:
        """Kill (with its subtree) and reap every child that is not a rank: a rank's
        descendant re-parented here when the rank died (this process is a subreaper)."""
        ranks = set().union(*self.owned.values()) if self.owned else set()
        deadline = time.monotonic() + wait_s
        while True:
            strays = [p for p in children_of(os.getpid()) if p not in ranks]
            for pid in strays:
                kill_tree(pid, include_root=True)
            self.orphans |= set(strays)
            self.reap_orphans(wait_s=0.5 if strays else 0.0)
            if not strays or time.monotonic() >= deadline:
                return

    def close_client(self, sock: socket.socket) -> None:
        self.kill_and_reap(self.owned.pop(sock, set()))
        self.selector.unregister(sock)
        sock.close()

    def stop(self) -> None:
        """The caller is gone (or closed us): nothing we started may outlive us -- the
        ranks, and whatever they started, which comes back here as they die."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for sock in list(self.owned):
            self.close_client(sock)
        self.kill_strays(wait_s=STOP_S)
        os._exit(0)


def place_fds(fds: list[int], targets: list[int]) -> None:
    """Put each received descriptor at the number the client had it at (``pass_fds``)."""
    high = max([*targets, *fds, 2]) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, high) for fd in fds]
    for fd in fds:
        os.close(fd)
    for fd, target in zip(moved, targets):
        os.dup2(fd, target)
        os.close(fd)


def become_rank(message: dict[str, Any], fds: list[int], sockets: list[socket.socket],
                selector: selectors.BaseSelector) -> None:
    """Step 4, in the child: never returns."""
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the server's own SIGTERM handling
        selector.close()
        for s in sockets:
            s.close()
        os.setsid()
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as a fresh interpreter
        log, passed = fds[0], fds[1:]
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        place_fds(passed, message["pass_fds"])
        os.chdir(message["cwd"])
        sys.path[0] = message["cwd"]  # what ``python -m`` puts first
        held = os.open(message["environ_file"], os.O_RDONLY)  # for life: see labkit.launchers.reaper
        environ = os.pread(held, os.fstat(held).st_size, 0)
        os.environb.clear()
        os.environb.update(entry.partition(b"=")[::2] for entry in environ.split(b"\0")
                           if b"=" in entry)
        from labkit.launchers.reaper import PARENT_ENV

        os.environ[PARENT_ENV] = str(os.getppid())  # our parent is this server
        import tempfile

        tempfile.tempdir = None  # the caller's TMPDIR, not ours
        sys.argv = [message["module"], *message["args"]]
        importlib.import_module(message["module"]).main(message["args"])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - a rank's start-up error goes to its log
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def main(argv: list[str]) -> None:
    control = socket.socket(fileno=int(argv[0]))
    # 1. Ctrl-C is the caller's; orphans come back here; die with the caller, ranks first
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_term)
    become_subreaper()
    if argv[1] == "1":
        from labkit.launchers.reaper import FORKSERVER_ENV, die_with_parent

        die_with_parent(int(os.environ[FORKSERVER_ENV]), signal.SIGTERM)  # the caller's pid
    # 2. the imports every rank would pay for, once
    try:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            os.environ.setdefault(var, "1")  # each rank sets its own torch threads per job
        extra = os.environ.get(PRELOAD_ENV, "").split(",")
        for name in [*PRELOAD, *(m.strip() for m in extra if m.strip())]:
            importlib.import_module(name)
        if threading.active_count() != 1:
            raise RuntimeError(f"{threading.active_count()} Python threads after the imports: "
                               f"forking could copy a held lock")
        import torch

        if torch.cuda.is_initialized():  # a forked child cannot use a parent's CUDA context
            raise RuntimeError(f"CUDA was initialised while importing {PRELOAD_ENV} modules")
    except BaseException:  # noqa: BLE001 - reported to the caller, which falls back
        send(control, {"error": traceback.format_exc()})
        os._exit(1)
    send(control, {"ready": os.getpid()})
    # 3. serve until the caller is gone
    server = Server(control)
    try:
        server.serve()
    except Stop:
        server.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
