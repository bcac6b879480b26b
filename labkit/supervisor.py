"""The supervisor: start N ranks, watch them, and always come back with an answer.

Modelled on PyTorch's ``MultiProcessTestCase`` (a pipe per rank carries its result or its
traceback; the parent polls and kills the rest on the first failure), never on a bare
``mp.spawn(join=True)``. Guarantees:

1. *No collisions.* Ranks meet through a ``FileStore`` in a private temp directory, so any
   number of students on one host can run at once (no "find a free port and hope").
   Ranks are plain ``python -m labkit._rank_main`` subprocesses: they never re-import the
   caller's script, so no ``if __name__ == "__main__"`` guard is needed anywhere.
2. *The first failure wins.* A rank's exception reaches the caller as its own traceback,
   labelled with its rank; a rank that dies by ``os._exit`` or a signal is reported with
   its exit code or signal. Peers' "connection closed" echoes are kept aside, not shown.
3. *Nothing hangs.* A run-level timeout stops a hung run and names the rank that stopped
   making progress (the one not blocked in communication), with every rank's Python stack.
4. *No orphans.* Children are reaped on success, failure, timeout and KeyboardInterrupt
   (the notebook's stop button); they also die with the parent (PR_SET_PDEATHSIG).

The supervisor process never imports torch: start-up cost stays in the ranks.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from labkit.board import Board
from labkit.errors import RankFailure, RunFailed, RunTimeout
from labkit.rank import Job, RankReport
from labkit.spool import read_spools
from labkit.timeline import Timeline

# Errors a rank raises only because *another* rank failed first.
_ECHO_MARKERS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                 "Socket Timeout", "Connection refused", "ECONNRESET", "EPIPE",
                 "Timed out waiting", "NCCL communicator was aborted")
_GRACE_S = 0.5  # after a failure, how long to wait for the other ranks' reports
_LOG_TAIL = 3000  # characters of a silently dead rank's output shown with its failure


def _child_env() -> dict[str, str]:
    """The parent's environment, with its sys.path so ranks import what the caller imports."""
    env = dict(os.environ)
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    cwd = os.getcwd()
    if cwd not in paths:
        paths.insert(0, cwd)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


class Supervisor:
    """Runs one job on ``world_size`` spawned ranks; use ``supervise(...)``."""

    def __init__(self, job_bytes: bytes, world_size: int, timeout_s: float,
                 on_progress: Any = None):
        self.job_bytes = job_bytes
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.on_progress = on_progress
        self.tmpdir = Path(tempfile.mkdtemp(prefix="labkit-run-"))
        self.procs: list[subprocess.Popen[bytes]] = []
        self.pidfds: dict[int, int] = {}
        self.conns: dict[int, Connection] = {}
        self.board = Board.create(str(self.tmpdir / "board"), world_size)
        self.status = [self.board.status(r) for r in range(world_size)]
        self.progress = [self.board.progress(r) for r in range(world_size)]
        self.logs: list[str] = [""] * world_size
        self.reports: dict[int, RankReport] = {}
        self.errors: list[tuple[int, RankFailure]] = []  # (monotonic ns, failure)
        self.deaths: list[RankFailure] = []

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        (self.tmpdir / "job.pkl").write_bytes(self.job_bytes)
        env = _child_env()
        for rank in range(self.world_size):
            read_fd, write_fd = os.pipe()
            log = open(self.tmpdir / f"rank-{rank}.log", "wb")  # noqa: SIM115
            try:
                p = subprocess.Popen(
                    [sys.executable, "-m", "labkit._rank_main", str(self.tmpdir), str(rank),
                     str(self.world_size), str(write_fd)],
                    pass_fds=(write_fd,), stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, env=env)
            finally:
                os.close(write_fd)
                log.close()
            self.procs.append(p)
            self.conns[rank] = Connection(read_fd, writable=False)
            self.pidfds[rank] = os.pidfd_open(p.pid)

    def run(self) -> list[RankReport]:
        self.start()
        try:
            return self._watch()
        except RunFailed as err:  # RunTimeout too: keep what the ranks recorded so far
            err.timeline = self._partial_timeline()
            raise
        finally:
            self.shutdown()

    def _partial_timeline(self) -> Timeline:
        """The events every rank spooled before the failure (see ``labkit.spool``)."""
        return Timeline(read_spools(self.tmpdir, self.world_size), self.world_size,
                        {"failed": True})

    def shutdown(self) -> None:
        """Kill whatever still runs, reap every child, keep the logs, remove the temp dir."""
        alive = [p for p in self.procs if p.poll() is None]
        for p in alive:
            p.terminate()
        deadline = time.monotonic() + 2.0
        for p in alive:
            try:
                p.wait(max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5.0)
        for c in self.conns.values():
            c.close()
        for fd in self.pidfds.values():
            os.close(fd)
        self.conns.clear()
        self.pidfds.clear()
        for rank in range(len(self.procs)):
            path = self.tmpdir / f"rank-{rank}.log"
            if path.exists():
                self.logs[rank] = path.read_text(errors="replace")
        self.board.close()
        shutil.rmtree(self.tmpdir, ignore_errors=True)

    # ---- the watch loop ------------------------------------------------------------------
    def _watch(self) -> list[RankReport]:
        start = time.monotonic()
        deadline = start + self.timeout_s
        failed_at: float | None = None
        sentinels = {fd: r for r, fd in self.pidfds.items()}
        while True:
            now = time.monotonic()
            if failed_at is not None and (now - failed_at > _GRACE_S or self._all_accounted()):
                raise RunFailed(*self._pick_failure())
            if len(self.reports) == self.world_size:
                self._reap_finished()
                return [self.reports[r] for r in range(self.world_size)]
            if now >= deadline:
                raise self._timeout()
            waitables: list[Any] = list(self.conns.values()) + list(sentinels)
            for obj in wait(waitables, timeout=min(0.2, max(0.0, deadline - now))):
                if obj in sentinels:
                    rank = sentinels.pop(obj)
                    if self._on_exit(rank) and failed_at is None:
                        failed_at = time.monotonic()
                else:
                    rank = next(r for r, c in self.conns.items() if c is obj)
                    if self._on_message(rank) and failed_at is None:
                        failed_at = time.monotonic()
            if self.on_progress is not None:
                self.on_progress(sum(v.value for v in self.progress))

    def _on_message(self, rank: int) -> bool:
        """Read one message; True if it reports a failure."""
        conn = self.conns[rank]
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            self.conns.pop(rank).close()
            return False
        if msg[0] == "result":
            self.reports[rank] = msg[2]
            return False
        _, _, t_ns, message, tb = msg
        self.errors.append((t_ns, RankFailure(rank, "exception", message, tb)))
        return True

    def _on_exit(self, rank: int) -> bool:
        """A child exited; True if it died without reporting (exit code or signal)."""
        code = self.procs[rank].wait()
        # drain a message the pipe may still hold (the result or the traceback)
        reported = False
        while rank not in self.reports and rank in self.conns and self.conns[rank].poll():
            reported |= self._on_message(rank)
        if code == 0 or rank in self.reports or reported or any(
                f.rank == rank for _, f in self.errors):
            return reported
        if code is not None and code < 0:
            name = signal.Signals(-code).name
            failure = RankFailure(rank, "signal", f"rank {rank} was killed by {name}")
        else:
            failure = RankFailure(rank, "exit", f"rank {rank} exited with code {code} without "
                                  f"reporting an error")
        log = (self.tmpdir / f"rank-{rank}.log").read_text(errors="replace")[-_LOG_TAIL:]
        failure.traceback = f"(last output of rank {rank})\n{log}" if log.strip() else ""
        self.deaths.append(failure)
        return True

    def _all_accounted(self) -> bool:
        done = {f.rank for _, f in self.errors} | {f.rank for f in self.deaths} | set(self.reports)
        return len(done) == self.world_size

    def _pick_failure(self) -> tuple[RankFailure, list[RankFailure]]:
        """The root cause: a real exception, else a silent death, else the earliest echo."""
        errors = [f for _, f in sorted(self.errors, key=lambda x: x[0])]
        real = [f for f in errors if not any(m in f.message + f.traceback for m in _ECHO_MARKERS)]
        ordered = real + self.deaths + [f for f in errors if f not in real]
        return ordered[0], ordered[1:]

    def _reap_finished(self) -> None:
        for p in self.procs:
            try:
                p.wait(5.0)
            except subprocess.TimeoutExpired:
                pass  # shutdown() kills it

    def _timeout(self) -> RunTimeout:
        running = [r for r, p in enumerate(self.procs) if p.poll() is None and r not in self.reports]
        for r in running:
            try:
                os.kill(self.procs[r].pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        time.sleep(0.3)
        stacks = []
        for r in running:
            path = self.tmpdir / f"stack-{r}.txt"
            text = path.read_text() if path.exists() else ""
            stacks.append(f"--- rank {r} (step {self.progress[r].value}) ---\n{text.strip()}")
        stuck = [r for r in running if self.status[r].value == 0]
        waiting = [r for r in running if r not in stuck]
        suspect: int | None = None
        if stuck and waiting:
            suspect = stuck[0]
            why = (f"rank {suspect} stopped making progress at step "
                   f"{self.progress[stuck[0]].value} outside any communication call, while "
                   f"rank(s) {', '.join(map(str, waiting))} waited for it")
        else:
            suspect = running[0] if len(running) == 1 else None
            why = "no rank made progress"
        message = (f"run timed out after {self.timeout_s:g} s: {why}; ranks still running: "
                   f"{', '.join(map(str, running)) or 'none'}")
        return RunTimeout(RankFailure(suspect, "timeout", message, "\n\n".join(stacks)))


def supervise(job: Job, world_size: int, timeout_s: float, on_progress: Any = None
              ) -> tuple[list[RankReport], list[str]]:
    """Run ``job`` on ``world_size`` ranks: (reports in rank order, each rank's output),
    or raise ``RunFailed`` / ``RunTimeout``."""
    import cloudpickle

    sup = Supervisor(cloudpickle.dumps(job), world_size, timeout_s, on_progress)
    try:
        reports = sup.run()
    except RunFailed as err:
        err.logs = sup.logs  # type: ignore[attr-defined]
        raise
    return reports, sup.logs
