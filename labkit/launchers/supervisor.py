"""The supervisor: start N ranks, watch them, and always come back with an answer.

Modelled on PyTorch's ``MultiProcessTestCase`` (a pipe per rank carries its result or its
traceback; the parent polls and kills the rest on the first failure), never on a bare
``mp.spawn(join=True)``. Guarantees:

1. *No collisions.* Ranks meet through a ``FileStore`` in a private temp directory, so any
   number of students on one host can run at once (no "find a free port and hope").
   Ranks run ``python -m labkit.launchers.rank_main``, forked from a warm fork server that imported
   torch once (``labkit.launchers.forkserver``; ``LABKIT_FORKSERVER=0`` execs each instead): they
   never re-import the caller's script, so no ``if __name__ == "__main__"`` guard is
   needed anywhere, and they start in milliseconds.
2. *The first failure wins.* A rank's exception reaches the caller as its own traceback,
   labelled with its rank; a rank that dies by ``os._exit`` or a signal is reported with
   its exit code or signal -- code 0 too, when it never handed in its result. Peers'
   "connection closed" echoes are kept aside, not shown.
3. *Nothing hangs.* A run-level timeout stops a hung run and names the rank that stopped
   making progress (the one not blocked in communication), with every rank's Python stack,
   what each rank was doing at which step, and how to raise the limit; a run whose ranks
   were all still finishing steps is reported as slow, not stuck.
4. *No orphans.* One path owns every child from its first ``Popen``: start-up, the watch
   and the cleanup share one ``try/finally``, so an interrupt or a failed spawn (EMFILE)
   half-way through start-up still kills what was started and removes the temp dir. Each
   rank leads its own process group (its forks die with it) and carries the run's id in
   its environment (daemons that left the group are found in ``/proc``); see
   ``labkit.launchers.reaper``. Every rank is a child subreaper, and so is the fork server:
   a daemon that left all of that still comes back to labkit and dies with its rank
   (``labkit.launchers.tree``). A second Ctrl-C during the cleanup is held back until it is
   done. Ranks also die with the parent (PR_SET_PDEATHSIG), and a run directory a killed
   parent could not remove is removed by the next run (``labkit.launchers.rundirs``).
5. *Results travel by value.* A rank pickles its report (cloudpickle) into bytes on the
   pipe, so tensors of any size arrive whole (``multiprocessing``'s own pickler would send
   them as shared memory owned by a rank that is about to exit). A result the parent
   cannot rebuild is that rank's failure, with the reason.

The supervisor process never imports torch: start-up cost stays in the ranks (and in the
fork server, which pays it once per process).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from labkit.analysis.timeline import Timeline
from labkit.base.errors import RankFailure, RunFailed, RunTimeout
from labkit.launchers import forkserver, rundirs
from labkit.launchers.board import Board
from labkit.launchers.rankmsg import decode
from labkit.launchers.reaper import (
    ENVIRON_FILE,
    PARENT_ENV,
    RUN_ID_ENV,
    environ_bytes,
    exited,
    interrupts_deferred,
    kill_group,
    kill_leftovers,
    stop_leaders,
)
from labkit.launchers.verdict import hang, pick_failure, silent_death
from labkit.rank.job import Job, RankReport
from labkit.trace.spool import read_spools

_GRACE_S = 0.5  # after a failure, how long to wait for the other ranks' reports
_TERM_GRACE_S = 2.0  # at shutdown, SIGTERM first; SIGKILL whatever is left after this


def child_env() -> dict[str, str]:
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
    """Runs one job on ``world_size`` spawned ranks; use ``supervise(...)``.

    ``labkit.launchers.pool.PoolSupervisor`` reuses all of it for ranks that stay up between jobs:
    it spawns ``entry`` with a command pipe more (``_spawn``'s extra arguments), keeps the
    ranks after a job (``_reap_finished``) and spools each job apart (``spool_dir``).
    """

    entry = "labkit.launchers.rank_main"
    """The module every rank runs (``python -m ENTRY RUN_DIR RANK WORLD_SIZE RESULT_FD ...``)."""

    def __init__(self, job_bytes: bytes | None, world_size: int, timeout_s: float,
                 on_progress: Any = None):
        self.job_bytes = job_bytes
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.on_progress = on_progress
        # named now, created inside run()'s try: nothing exists that the cleanup could miss
        self.run_id = f"labkit-run-{uuid.uuid4().hex[:12]}"
        self.tmpdir = Path(tempfile.gettempdir()) / self.run_id
        self.spool_dir = self.tmpdir
        """Where the ranks spool the current job's events (``labkit.trace.spool``)."""
        self.procs: list[Any] = []
        """Each rank's process: a ``subprocess.Popen``, or a ``forkserver.ForkedRank``."""
        self.forks: forkserver.Client | None = None
        self.pidfds: dict[int, int] = {}
        self.owner: Any = None
        """The open, locked ``owner.lock`` that says this run is alive (``rundirs``)."""
        self.conns: dict[int, Connection] = {}
        self.board: Board | None = None
        self.status: list[Any] = []
        self.progress: list[Any] = []
        self.began: list[Any] = []
        """Each rank's first step + 1 (0: still starting), from the board."""
        self.logs: list[str] = [""] * world_size
        self.reports: dict[int, RankReport] = {}
        self.errors: list[tuple[int, RankFailure]] = []  # (monotonic ns, failure)
        self.deaths: list[RankFailure] = []
        self.watch_start = 0.0
        self.moved: dict[int, tuple[int, float]] = {}
        """Rank -> (its step counter, when it last changed), for the timeout's verdict."""
        self.first: dict[int, tuple[int, float]] = {}
        """Rank -> (the step it began with, when that was seen): its steps are timed from
        there, so its start-up (an exec'd rank imports torch) is not step time."""

    # ---- lifecycle ---------------------------------------------------------------------
    def run(self) -> list[RankReport]:
        """Start the ranks, watch them, clean up: one ``try/finally`` owns every child."""
        try:
            self.start()
            return self.watch_job()
        finally:
            self.shutdown_now()

    def watch_job(self) -> list[RankReport]:
        """The reports of the job the ranks run, or ``RunFailed`` with its partial timeline."""
        try:
            return self._watch()
        except RunFailed as err:  # RunTimeout too: keep what the ranks recorded so far
            err.timeline = self._partial_timeline()
            raise

    def shutdown_now(self) -> None:
        """``shutdown``, finished even when a Ctrl-C arrives before it could hold it back."""
        try:
            self.shutdown()
        except KeyboardInterrupt:
            self.shutdown()  # idempotent: finish the cleanup, then stop as asked
            raise

    def start(self) -> None:
        """Create the run directory and spawn every rank (called by ``run``); first remove
        what dead runs (a kernel killed outright) left in the temp dir."""
        rundirs.sweep(str(self.tmpdir.parent))
        self.tmpdir.mkdir(mode=0o700)
        self.owner = rundirs.hold(self.tmpdir)
        self.board = Board.create(str(self.tmpdir / "board"), self.world_size)
        self.status = [self.board.status(r) for r in range(self.world_size)]
        self.progress = [self.board.progress(r) for r in range(self.world_size)]
        self.began = [self.board.began(r) for r in range(self.world_size)]
        if self.job_bytes is not None:  # a pool's ranks get their jobs on a pipe instead
            (self.tmpdir / "job.pkl").write_bytes(self.job_bytes)
        env = child_env()
        env[RUN_ID_ENV] = self.run_id  # inherited by every descendant (labkit.launchers.reaper)
        env[rundirs.RUN_DIR_ENV] = str(self.tmpdir)
        env[PARENT_ENV] = str(os.getpid())
        (self.tmpdir / ENVIRON_FILE).write_bytes(environ_bytes(env))  # forked ranks hold it
        self.forks = forkserver.connect(env)
        for rank in range(self.world_size):
            try:
                self._spawn(rank, env)
            except OSError as exc:  # EMFILE / EAGAIN / ENOMEM at a large world size
                raise RunFailed(RankFailure(
                    rank, "start", f"could not start rank {rank} of {self.world_size}: "
                    f"{exc} ({len(self.procs)} rank(s) started were stopped); free "
                    f"resources (`ulimit -n`, memory) or use a smaller world_size")) from exc

    def _spawn(self, rank: int, env: dict[str, str], extra_args: tuple[str, ...] = (),
               extra_fds: tuple[int, ...] = ()) -> None:
        """Start one rank; ``extra_fds`` are passed to it too (the caller closes its copies)."""
        read_fd, write_fd = os.pipe()
        self.conns[rank] = Connection(read_fd, writable=False)  # owns read_fd from here
        args = [str(self.tmpdir), str(rank), str(self.world_size), str(write_fd), *extra_args]
        try:
            with open(self.tmpdir / f"rank-{rank}.log", "wb") as log, interrupts_deferred():
                # a rank is in self.procs before a Ctrl-C can land: shutdown will find it
                if self.forks is not None:  # forked from the warm server (labkit.launchers.forkserver)
                    p: Any = self.forks.spawn(self.entry, args, stdout=log.fileno(),
                                              environ_file=str(self.tmpdir / ENVIRON_FILE),
                                              pass_fds=(write_fd, *extra_fds))
                else:
                    p = subprocess.Popen([sys.executable, "-m", self.entry, *args],
                                         pass_fds=(write_fd, *extra_fds),
                                         stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
                self.procs.append(p)
                self.pidfds[rank] = os.pidfd_open(p.pid)
        finally:
            os.close(write_fd)

    def _partial_timeline(self) -> Timeline:
        """The events every rank spooled before the failure (see ``labkit.trace.spool``)."""
        return Timeline(read_spools(self.spool_dir, self.world_size), self.world_size,
                        {"failed": True})

    def shutdown(self) -> None:
        """Kill whatever still runs (and its descendants), reap every child, keep the logs,
        remove the temp dir. Idempotent; a Ctrl-C meanwhile is raised once it is done."""
        with interrupts_deferred() as stop:
            stop_leaders(self.procs, stop, _TERM_GRACE_S)
            # what the ranks left: forks still exiting, daemons that left the group
            kill_leftovers(self.run_id, {p.pid for p in self.procs})
            for c in self.conns.values():
                c.close()
            for fd in self.pidfds.values():
                os.close(fd)
            self.conns.clear()
            self.pidfds.clear()
            if self.forks is not None:  # the server kills and reaps anything still ours
                self.forks.close()
                self.forks = None
            for rank in range(len(self.procs)):
                path = self.tmpdir / f"rank-{rank}.log"
                if path.exists():
                    self.logs[rank] = path.read_text(errors="replace")
            if self.board is not None:
                self.board.close()
                self.board = None
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            if self.owner is not None:
                self.owner.close()
                self.owner = None

    # ---- the watch loop ------------------------------------------------------------------
    def _watch(self) -> list[RankReport]:
        start = time.monotonic()
        deadline = start + self.timeout_s
        failed_at: float | None = None
        sentinels = {fd: r for r, fd in self.pidfds.items()}
        self.watch_start = start
        self.moved = {r: (v.value, start) for r, v in enumerate(self.progress)}
        self.first = {}
        while True:
            now = time.monotonic()
            self._note_progress(now)
            if failed_at is not None and (now - failed_at > _GRACE_S or self._all_accounted()):
                raise RunFailed(*pick_failure(self.errors, self.deaths))
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
                    found = [r for r, c in self.conns.items() if c is obj]
                    if found and self._on_message(found[0]) and failed_at is None:
                        failed_at = time.monotonic()  # (no match: drained by _on_exit)
            if self.on_progress is not None:
                self.on_progress(sum(v.value for v in self.progress))

    def _note_progress(self, now: float) -> None:
        """When each rank began its first step and when its step counter last moved: a
        timeout tells a slow run (every rank still finishing steps) from a stuck one."""
        for r, v in enumerate(self.progress):
            if r not in self.first and (began := self.began[r].value) > 0:
                self.first[r] = (began - 1, now)
            value = v.value
            if value != self.moved[r][0]:
                self.moved[r] = (value, now)

    def _on_message(self, rank: int) -> bool:
        """Read one message; True if it reports a failure (an error, or a result that
        cannot be rebuilt here: ``labkit.launchers.rankmsg``)."""
        conn = self.conns[rank]
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            self.conns.pop(rank).close()
            return False
        report, error = decode(rank, data)
        if error is None:
            self.reports[rank] = report
            return False
        self.errors.append(error)
        return True

    def _on_exit(self, rank: int) -> bool:
        """A child exited; True if it died without reporting (exit code -- 0 included -- or
        signal). Its process group is killed before it is reaped: a rank's forks go with it."""
        p = self.procs[rank]
        kill_group(p.pid, signal.SIGKILL)
        code = p.wait()
        # drain a message the pipe may still hold (the result or the traceback)
        reported = False
        while rank not in self.reports and rank in self.conns and self.conns[rank].poll():
            reported |= self._on_message(rank)
        if rank in self.reports or reported or any(f.rank == rank for _, f in self.errors):
            return reported
        log = (self.tmpdir / f"rank-{rank}.log").read_text(errors="replace")
        failure = silent_death(rank, code, log)
        self.deaths.append(failure)
        return True

    def _all_accounted(self) -> bool:
        done = {f.rank for _, f in self.errors} | {f.rank for f in self.deaths} | set(self.reports)
        return len(done) == self.world_size

    def _reap_finished(self) -> None:
        """Every rank reported: wait (briefly) for each to exit, then kill its group and
        reap it. Stragglers are left to ``shutdown``."""
        pending = {self.pidfds[r]: p for r, p in enumerate(self.procs)
                   if p.returncode is None and r in self.pidfds}
        deadline = time.monotonic() + 5.0
        while pending and time.monotonic() < deadline:
            for fd in wait(list(pending), timeout=max(0.0, deadline - time.monotonic())):
                p = pending.pop(fd)  # type: ignore[arg-type]
                kill_group(p.pid, signal.SIGKILL)
                p.wait()

    def _timeout(self) -> RunTimeout:
        """Ask every rank still running for its Python stack (SIGUSR1), then name the one
        the others wait for."""
        running = [r for r, p in enumerate(self.procs)
                   if not exited(p) and r not in self.reports]
        for r in running:
            try:
                os.kill(self.procs[r].pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        time.sleep(0.3)
        stacks = {}
        for r in running:
            path = self.tmpdir / f"stack-{r}.txt"
            stacks[r] = path.read_text() if path.exists() else ""
        now = time.monotonic()
        self._note_progress(now)
        steps = {r: self.progress[r].value for r in running}
        timed = [r for r in running if r in self.first and self.moved[r][1] >= self.first[r][1]]
        return hang(self.timeout_s, running, {r: self.status[r].value != 0 for r in running},
                    steps, stacks, idle_s={r: now - self.moved[r][1] for r in timed},
                    busy_s={r: self.moved[r][1] - self.first[r][1] for r in timed},
                    done={r: steps[r] - self.first[r][0] for r in timed})


def supervise(job: Job, world_size: int, timeout_s: float, on_progress: Any = None
              ) -> tuple[list[RankReport], list[str]]:
    """Run ``job`` on ``world_size`` ranks: (reports in rank order, each rank's output),
    or raise ``RunFailed`` / ``RunTimeout``."""
    import cloudpickle

    from labkit.base.errors import ConfigError
    from labkit.base.validate import local_world_size_problem

    too_many = local_world_size_problem(world_size)
    if too_many is not None:  # callers check first; this guards everyone else
        raise ConfigError(too_many)
    sup = Supervisor(cloudpickle.dumps(job), world_size, timeout_s, on_progress)
    try:
        reports = sup.run()
    except RunFailed as err:
        err.logs = sup.logs  # type: ignore[attr-defined]
        raise
    return reports, sup.logs
