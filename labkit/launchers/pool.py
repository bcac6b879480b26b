"""A warm pool of ranks: rerun a job in a fraction of a second instead of paying start-up.

Every ``labkit.run`` forks N ranks (from the kernel's fork server, ``labkit.launchers.forkserver``,
which imported torch once) and builds a process group: about 0.2 s before the first step
for two ranks, more with more ranks -- noticeable behind a slider that fires on every move.
A ``Pool`` starts its ranks once and keeps them, with their process group, between calls::

    with labkit.Pool(world_size=2) as pool:
        first = pool.run(strategy="ddp", steps=5)    # starts the ranks
        again = pool.run(strategy="ddp", steps=5)    # reuses them: a fraction of the time
        assert first.params_sha256 == again.params_sha256 == labkit.run(...).params_sha256

In a notebook, ``labkit.pool(2)`` gives the kernel's pool (one per kernel, closed at exit).

How it stays equal to a fresh run, and safe:

1. *Same machinery.* The ranks are started, watched and cleaned up by the supervisor
   (``PoolSupervisor`` is a ``labkit.launchers.supervisor.Supervisor``): one process group per rank,
   the run id in their environment, results by value, first failure wins, a timeout names
   the hung rank. Each call ships its job (cloudpickled) down a command pipe per rank.
2. *Same bits.* A warm rank runs each job the way a fresh one does
   (``labkit.rank.group.RankGroup.run``): seeds and generators reset, fresh tracer and comms
   (grid sub-groups made once per grid, reused), clocks aligned per call. Same seed, same
   ``params_sha256``.
3. *A failure rebuilds.* An exception, an exit, a kill, a timeout or Ctrl-C is reported
   exactly as ``labkit.run`` reports it, and the ranks are torn down (a failed collective
   can leave the group in any state); the next call starts new ones.
4. *No orphans.* The ranks leave when the pool closes (end of file on their command pipe),
   and when the process holding the pool dies, also by SIGKILL: PR_SET_PDEATHSIG, and a
   watchdog thread in each rank that polls its parent (``labkit.launchers.pool_main``).
"""

from __future__ import annotations

import atexit
import os
import pickle
import shutil
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from labkit.base import devices
from labkit.base.errors import ConfigError, LabError, RunFailed
from labkit.base.validate import int_problem, local_world_size_problem
from labkit.config.rules import MAX_THREADS, MAX_TIMEOUT_S, auto_backend, backend_problem
from labkit.config.run import RunConfig
from labkit.launchers.jobs import launch_job, make_config
from labkit.launchers.reaper import exited
from labkit.launchers.results import LaunchResult, RunResult
from labkit.launchers.runner import launch_with, run_config
from labkit.launchers.supervisor import Supervisor
from labkit.rank.job import Job, RankReport

GROUP_TIMEOUT_S = MAX_TIMEOUT_S + 30
"""The process group's own timeout: only a backstop, each job's timeout_s is watched here."""
CLOSE_GRACE_S = 2.0  # a closed pool's ranks leave by themselves within this, else are killed


def pool_problems(config: RunConfig, world_size: int, backend: str) -> list[str]:
    """Why ``config`` cannot run on a pool of ``world_size`` ranks on ``backend`` (empty: it
    can): its ranks and backend are the pool's, started by labkit, on this one machine."""
    problems = []
    if config.world_size != world_size:
        problems.append(f"world_size ({config.world_size}) must equal this pool's "
                        f"({world_size}); e.g. labkit.Pool({config.world_size})"
                        f".run(...) or world_size={world_size}")
    if config.resolved_backend() != backend:
        problems.append(f"backend {config.resolved_backend()!r} must be this pool's "
                        f"({backend!r}); e.g. backend={backend!r}")
    if config.launcher != "labkit":
        problems.append(f"launcher {config.launcher!r} starts its own ranks; a pool's are "
                        f"labkit's: use labkit.run(..., launcher={config.launcher!r}) or "
                        f"drop launcher")
    if config.nodes != 1:
        problems.append(f"nodes ({config.nodes}) start one torchrun agent per emulated "
                        f"node; a pool's ranks share this machine's loopback: use "
                        f"labkit.run(..., nodes={config.nodes}) or drop nodes")
    return problems


class PoolSupervisor(Supervisor):
    """The supervisor of ranks that stay up between jobs (``labkit.launchers.pool_main``)."""

    entry = "labkit.launchers.pool_main"

    def __init__(self, world_size: int, backend: str, threads: int):
        super().__init__(None, world_size, timeout_s=60.0)
        self.backend, self.threads = backend, threads
        self.commands: dict[int, Connection] = {}
        self.started = False
        self.jobs = 0
        self.offsets = [0] * world_size
        # PR_SET_PDEATHSIG fires when the starting *thread* exits: arm it only from main
        self.die_with_parent = threading.current_thread() is threading.main_thread()

    def start(self) -> None:
        self.started = True  # set first: a start cut short is still cleaned up
        super().start()

    def _spawn(self, rank: int, env: dict[str, str], extra_args: tuple[str, ...] = (),
               extra_fds: tuple[int, ...] = ()) -> None:
        read_fd, write_fd = os.pipe()
        self.commands[rank] = Connection(write_fd, readable=False)  # owns write_fd
        try:
            super()._spawn(rank, env, (str(read_fd), self.backend, str(self.threads),
                                       str(GROUP_TIMEOUT_S), "1" if self.die_with_parent
                                       else "0"), (read_fd,))
        finally:
            os.close(read_fd)

    def submit(self, job_bytes: bytes, timeout_s: float, on_progress: Any
               ) -> tuple[list[RankReport], list[str]]:
        """Hand one job to the ranks (starting them if needed) and watch it like a fresh run.
        Any failure, Ctrl-C included, tears every rank down before it is raised."""
        self.jobs += 1
        self.timeout_s, self.on_progress = timeout_s, on_progress
        self.reports, self.errors, self.deaths = {}, [], []
        try:
            if not self.started:
                self.start()
            self.spool_dir = self.tmpdir / f"job-{self.jobs}"
            self.spool_dir.mkdir()
            for slot in self.status + self.progress + self.began:  # every job starts at zero
                slot.value = 0
            self.offsets = [self._log_size(r) for r in range(self.world_size)]
            message = pickle.dumps((str(self.spool_dir), job_bytes))
            for rank in range(self.world_size):
                self.commands[rank].send_bytes(message)
            reports = self.watch_job()
        except BaseException as exc:
            if isinstance(exc, RunFailed):
                exc.logs = self.job_logs()  # type: ignore[attr-defined]
            self.shutdown_now()
            raise
        shutil.rmtree(self.spool_dir, ignore_errors=True)
        return reports, self.job_logs()

    def alive(self) -> bool:
        """Whether every rank is still up (or not started yet)."""
        return all(not exited(p) for p in self.procs)

    def _reap_finished(self) -> None:
        """The job is done, the ranks are not: they wait for the next one."""

    def _log_size(self, rank: int) -> int:
        try:
            return (self.tmpdir / f"rank-{rank}.log").stat().st_size
        except OSError:
            return 0

    def job_logs(self) -> list[str]:
        """What each rank printed during the current job."""
        out = []
        for rank in range(self.world_size):
            try:
                with open(self.tmpdir / f"rank-{rank}.log", "rb") as f:
                    f.seek(self.offsets[rank])
                    out.append(f.read().decode(errors="replace"))
            except OSError:
                out.append("")
        return out

    def close(self) -> None:
        """Let the ranks leave (end of file on their commands), then clean up as always."""
        for conn in self.commands.values():
            conn.close()
        self.commands.clear()
        deadline = time.monotonic() + CLOSE_GRACE_S
        while time.monotonic() < deadline and not all(
                exited(p) for p in self.procs):
            time.sleep(0.02)
        self.shutdown_now()

    def shutdown(self) -> None:
        for conn in self.commands.values():
            conn.close()
        self.commands.clear()
        super().shutdown()


class Pool:
    """``world_size`` warm ranks that run job after job; see the module docstring."""

    def __init__(self, world_size: int = 2, *, backend: str = "auto",
                 threads_per_rank: int | None = None):
        problems = [local_world_size_problem(world_size),  # RunConfig's rules, stated once
                    backend_problem(backend, world_size),
                    None if threads_per_rank is None else int_problem(
                        "threads_per_rank", threads_per_rank, 1, MAX_THREADS, example=1)]
        if any(problems):
            raise ConfigError([p for p in problems if p])
        self.world_size = world_size
        self.backend = auto_backend(world_size) if backend == "auto" else backend
        self.threads = threads_per_rank or devices.default_threads_per_rank(world_size)
        self.starts = 0
        """How many times ranks were started (1 + the rebuilds after failures)."""
        self.closed = False
        self._sup: PoolSupervisor | None = None

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("warm" if self._sup is not None else "cold")
        return (f"Pool(world_size={self.world_size}, backend={self.backend!r}, {state}, "
                f"started {self.starts} time(s))")

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def warm(self) -> bool:
        """Whether ranks are up now (the next call pays no start-up)."""
        return self._sup is not None

    def run(self, config: RunConfig | None = None, /, **kwargs: Any) -> RunResult:
        """``labkit.run`` on this pool's ranks: same arguments, same ``RunResult``."""
        config = make_config(config, kwargs)
        problems = pool_problems(config, self.world_size, self.backend)
        if problems:
            raise ConfigError(problems)
        return run_config(config, self._execute)

    def launch(self, fn: Any, *args: Any, timeout_s: float = 60.0, seed: int = 0,
               threads_per_rank: int | None = None, trace: bool = True,
               progress: bool | None = None) -> LaunchResult:
        """``labkit.launch(fn, world_size, *args)`` on this pool's ranks."""
        job = launch_job(fn, self.world_size, args, backend=self.backend, timeout_s=timeout_s,
                         seed=seed, threads_per_rank=threads_per_rank, trace=trace,
                         progress=progress)
        return launch_with(job, self.world_size, self._execute, progress)

    def _execute(self, job: Job, world_size: int, timeout_s: float, on_progress: Any
                 ) -> tuple[list[RankReport], list[str]]:
        import cloudpickle

        if self.closed:
            raise LabError("this pool is closed; start another: labkit.Pool(world_size=2) "
                           "(or labkit.pool(2) in a notebook)")
        if self._sup is not None and not self._sup.alive():
            self._sup.shutdown_now()  # a rank died while idle (killed from outside): rebuild
            self._sup = None
        if self._sup is None:
            self._sup = PoolSupervisor(self.world_size, self.backend, self.threads)
            self.starts += 1
        try:
            return self._sup.submit(cloudpickle.dumps(job), timeout_s, on_progress)
        except BaseException:
            self._sup = None  # torn down by submit: the next call starts new ranks
            raise

    def close(self) -> None:
        """Stop the ranks and remove their files (idempotent)."""
        self.closed = True
        sup, self._sup = self._sup, None
        if sup is not None:
            sup.close()


_KERNEL_POOL: Pool | None = None


def pool(world_size: int = 2, backend: str = "auto") -> Pool:
    """The pool of this process (a notebook kernel): made on first use, reused by every cell
    and widget after, closed when the process exits. Asking for another world size or
    backend closes it and starts one of that size (one pool per kernel keeps memory low:
    each rank holds its own torch)."""
    global _KERNEL_POOL
    current = _KERNEL_POOL
    if current is not None and not current.closed and current.world_size == world_size \
            and backend in ("auto", current.backend):
        return current
    made = Pool(world_size, backend=backend)  # validated before the old one goes
    if current is not None:
        current.close()
    else:
        atexit.register(_close_kernel_pool)
    _KERNEL_POOL = made
    return made


def _close_kernel_pool() -> None:
    if _KERNEL_POOL is not None:
        _KERNEL_POOL.close()
