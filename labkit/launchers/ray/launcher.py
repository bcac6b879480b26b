"""``labkit run STRATEGY --launcher ray``: the same ranks, started by Ray Train.

For users who already run a Ray cluster, Ray Train's ``TorchTrainer`` (docs.ray.io, "Ray
Train Overview") can start labkit's ranks instead of labkit's supervisor. Nothing about a
rank changes: each Ray Train worker runs ``labkit.rank.context.run_rank`` with the same ``Job``
``labkit.run`` builds, so the same seed gives the same weights (``params_sha256``) and the
same timeline. The steps:

1. start (or reuse) Ray with bounded resources (``labkit.launchers.ray.session``) and an *inbox*
   actor (no CPU) that collects what every rank sends back;
2. ``TorchTrainer`` starts ``world_size`` workers (each asks for at most one CPU, fewer when
   the cluster has fewer cores than ranks) and makes the default process group through its
   env:// rendezvous (``TorchConfig(backend, timeout_s)``); every worker then runs the rank
   on that group (``run_rank(existing_group=True)``), with a watchdog that reports the rank's
   stack and stops it if it outlives the run's timeout. The run's clock starts when the last
   worker has started: on a busy machine starting them takes minutes (``START_LIMIT_S``); each
   worker first waits for the actors Ray Train starts beside it to settle (``settle_helpers``);
3. each rank posts its ``RankReport`` (or its error) to the inbox; the driver combines the
   reports with ``labkit.launchers.results.collect`` into the usual ``RunResult``;
4. a failure comes back as ``RunFailed`` naming the rank, chosen like the supervisor does:
   a real exception first, then a rank that died silently, then the "peer went away" echoes;
   a timeout as ``RunTimeout`` naming the rank that hung outside communication.

Ray Train retries nothing here (``FailureConfig(max_failures=0)``): a failed rank ends the
run, as under labkit's supervisor.
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import math
import os
import shutil
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from labkit.base.errors import RankFailure, RunFailed, RunTimeout
from labkit.base.progress import clock, showing
from labkit.config.run import RunConfig
from labkit.launchers import rundirs
from labkit.launchers.ray.session import SESSION_ENV, ensure_ray, guard_removes
from labkit.launchers.verdict import waits_in_torch
from labkit.rank.job import RunJob

_BACKSTOP_S = 120.0
"""After the run's timeout, how long the driver still waits for Ray Train to return."""
START_LIMIT_S = 600.0
"""How long Ray Train may take to start every worker: slow on a busy laptop (minutes), so it
is not the run's timeout; only a Ray that never starts them (no free CPU) reaches it."""
_ECHOES = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
           "Socket Timeout", "Connection refused", "ECONNRESET", "EPIPE", "Timed out waiting")
"""Errors a rank raises only because another rank failed first (as in the supervisor)."""


class Inbox:
    """The Ray actor every rank of one run reports to (results, errors, timeouts, output)."""

    def __init__(self) -> None:
        self.reports: dict[int, Any] = {}
        self.errors: list[tuple[int, RankFailure]] = []
        self.logs: dict[int, str] = {}
        self.ranks_started: set[int] = set()

    def started(self, rank: int) -> None:
        self.ranks_started.add(rank)

    def started_count(self) -> int:
        return len(self.ranks_started)

    def report(self, rank: int, report: Any, log: str) -> None:
        self.reports[rank], self.logs[rank] = report, log

    def error(self, rank: int, t_ns: int, failure: RankFailure, log: str) -> None:
        self.errors.append((t_ns, failure))
        self.logs[rank] = log

    def contents(self) -> tuple[dict[int, Any], list[tuple[int, RankFailure]], dict[int, str]]:
        return self.reports, self.errors, self.logs


class _Slot:
    """A value the rank updates: "blocked in communication" (``Comm``) or the step it is in."""

    value = 0


_FIT_END_S = 10.0
"""After an interrupt shut Ray down, how long ``trainer.fit()`` gets to notice and return."""
_PEER_GRACE_S = 5.0
"""A rank that times out while waiting in communication waits this long before it stops,
so the rank it waits for (whose clock started a moment later) reports first."""


def _watchdog(timeout_s: float, rank: int, world_size: int, inbox: Any, status: _Slot,
              step: _Slot) -> threading.Event:
    """Report this rank's stack as a timeout, then stop it, if it outlives the run's
    timeout, counted from when *every* rank has started (on a busy machine Ray Train starts
    workers seconds apart: a clock per rank would blame whoever started first). Set the
    returned event to cancel."""
    import ray

    cancelled = threading.Event()

    def fire() -> None:
        with tempfile.TemporaryFile("w+") as f:
            faulthandler.dump_traceback(file=f, all_threads=True)
            f.seek(0)
            stack = f.read()
        # inside labkit's Comm, or inside torch.distributed called by torch itself (DDP)
        waiting = status.value or waits_in_torch(stack)
        where = "waiting in communication" if waiting else "outside any communication call"
        failure = RankFailure(rank, "timeout", f"rank {rank} was still running after "
                              f"{timeout_s:g} s, at step {step.value}, {where}", stack)
        try:
            ray.get(inbox.error.remote(rank, time.monotonic_ns(), failure, ""), timeout=10)
            if waiting:  # let the rank this one waits for report too
                time.sleep(_PEER_GRACE_S)
        finally:
            os._exit(1)

    def watch() -> None:
        deadline = time.monotonic() + START_LIMIT_S
        while not cancelled.is_set() and time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # a slow answer is asked again
                if ray.get(inbox.started_count.remote(), timeout=10) >= world_size:
                    break
            cancelled.wait(0.2)
        if not cancelled.wait(timeout_s):
            fire()

    threading.Thread(target=watch, daemon=True, name=f"labkit-watchdog-{rank}").start()
    return cancelled


SETTLE_LIMIT_S = 30.0
"""The longest a rank waits for Ray's helper processes to settle before its first step."""
SETTLE_BUSY = 0.25
"""A helper using more than this share of a core over ``SETTLE_WINDOW_S`` is still busy."""
SETTLE_WINDOW_S = 0.5


def ray_helpers() -> list[Any]:
    """This Ray session's processes (``guard.session_processes``; every Ray process where the
    session is not labkit's) but the train workers and this one: the actors Ray Train starts
    beside the workers (its controller, a ``DatasetManager`` for every fit, datasets or not),
    workers Ray is still starting (``python .../default_worker.py`` until they name
    themselves ``ray::...``: the DatasetManager is busiest then) or keeps idle, Ray's own
    daemons and the lab's actors. Another notebook's Ray is not this run's."""
    import psutil

    from labkit.launchers.ray.guard import session_processes
    from labkit.launchers.ray.session import ray_processes

    mark = os.environ.get(SESSION_ENV)
    pids = session_processes(mark) if mark else [pid for pid, _ in ray_processes()]
    out = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if pid != os.getpid() and "RayTrainWorker" not in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:  # gone since the listing, or not ours to read
            continue
    return out


def _cpu_s(p: Any) -> float:
    import psutil

    try:
        t = p.cpu_times()
        return float(t.user + t.system)
    except psutil.Error:  # gone (or not ours to read): it uses no core
        return float("inf")


def settle_helpers(limit_s: float = SETTLE_LIMIT_S) -> float:
    """Wait until no Ray helper process (``ray_helpers``) uses more than ``SETTLE_BUSY`` of a
    core, at most ``limit_s``; the seconds waited. Ray Train 2 starts a ``DatasetManager``
    actor for every fit, which imports Ray Data: measured here, it took half a core for about
    6 s just as the ranks began to step, and a 3 ms step on 2 cores ran 2-5x as long beside it
    (docs/benchmarks.md). Its start-up is Ray's, not the run's: the ranks step after it."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        procs = ray_helpers()
        before = [_cpu_s(p) for p in procs]
        time.sleep(SETTLE_WINDOW_S)
        after = [_cpu_s(p) for p in procs]
        if not any(math.isfinite(a - b) and a - b > SETTLE_BUSY * SETTLE_WINDOW_S
                   for a, b in zip(after, before)):
            break
    return time.monotonic() - t0


def rank_on_ray(loop_config: dict[str, Any]) -> None:
    """What every Ray Train worker runs (step 2-3 of the module docstring)."""
    import ray
    import ray.train

    from labkit.rank.group import run_rank

    job, inbox = loop_config["job"], loop_config["inbox"]
    ctx = ray.train.get_context()
    rank, status, step, log = ctx.get_world_rank(), _Slot(), _Slot(), io.StringIO()
    # the imports every rank pays before its first step (labkit's fork server pays them
    # once for all): a busy machine makes them slow, and they are not the run
    import torch._dynamo
    import torch.nn.parallel  # noqa: F401

    settle_helpers()  # Ray Train's own start-up is not the run's
    ray.get(inbox.started.remote(rank))  # the driver's run clock starts with the last rank
    stop_watchdog = _watchdog(job.timeout_s, rank, ctx.get_world_size(), inbox, status, step)
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            report = run_rank(job, rank, ctx.get_world_size(), local_rank=ctx.get_local_rank(),
                              status=status, progress=step, existing_group=True)
    except BaseException as exc:
        failure = RankFailure(rank, "exception", f"{type(exc).__name__}: {exc}",
                              traceback.format_exc())
        ray.get(inbox.error.remote(rank, time.monotonic_ns(), failure, log.getvalue()))
        raise
    finally:
        stop_watchdog.set()
    ray.get(inbox.report.remote(rank, report, log.getvalue()))


def run_on_ray(job: RunJob) -> Any:
    """``labkit.run(config)`` with ``config.launcher == "ray"``: the same ``RunResult``, from
    the same resolved ``Job`` (``labkit.launchers.jobs.job_for``)."""
    from labkit.launchers.results import collect

    ray = ensure_ray()  # 1.
    from ray.train import FailureConfig, ScalingConfig
    from ray.train import RunConfig as TrainRunConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    config, backend = job.config, job.backend
    cpus = float(ray.cluster_resources().get("CPU", 1.0))
    per_worker: dict[str, float] = {"CPU": min(1.0, cpus / config.world_size)}
    if backend == "nccl":
        per_worker["GPU"] = 1.0
    inbox = ray.remote(num_cpus=0)(Inbox).remote()
    # Ray Train's storage: a run directory like the supervisor's, locked while this driver
    # lives; a driver killed outright (no finally) leaves it to the Ray session's guard,
    # and a guard killed too to the next run's sweep
    storage = tempfile.mkdtemp(prefix=f"{rundirs.PREFIX}raytrain-")
    owner = rundirs.hold(Path(storage))
    guard_removes(storage)
    trainer = TorchTrainer(  # 2.
        rank_on_ray, train_loop_config={"job": job, "inbox": inbox},
        torch_config=TorchConfig(backend=backend, timeout_s=int(config.timeout_s + 30)),
        scaling_config=ScalingConfig(num_workers=config.world_size, use_gpu=backend == "nccl",
                                     resources_per_worker=per_worker),
        run_config=TrainRunConfig(storage_path=storage, name=f"labkit-{config.strategy}",
                                  failure_config=FailureConfig(max_failures=0)))
    t0 = time.monotonic()
    # Ray Train takes seconds to start its workers: the time so far and how many started
    shown = clock(f"Ray Train: {config.strategy} x{config.world_size}", config.progress)

    def started(n: int) -> None:
        if shown is not None:
            shown.set_postfix_str(f"{n} of {config.world_size} workers started", refresh=False)

    try:
        with showing(shown):
            fit_error = _fit(trainer, inbox, config.world_size, config.timeout_s + _BACKSTOP_S,
                             on_started=started)
        reports, errors, logs = ray.get(inbox.contents.remote())  # 3.
    finally:
        if ray.is_initialized():  # not after an interrupt shut Ray down (``_stop_now``)
            ray.kill(inbox)
        owner.close()
        shutil.rmtree(storage, ignore_errors=True)
    if fit_error is not None or len(reports) < config.world_size:
        raise _failure(config, fit_error, reports, errors)  # 4.
    result = collect(job, [reports[r] for r in range(config.world_size)],
                     time.monotonic() - t0)
    result.logs = [logs.get(r, "") for r in range(config.world_size)]
    return result


def _fit(trainer: Any, inbox: Any, world_size: int, limit_s: float,
         on_started: Callable[[int], None] | None = None) -> BaseException | None:
    """``trainer.fit()`` with a backstop: the error it raised, or None. The backstop is
    ``limit_s`` from when every worker started (starting them may take minutes on a busy
    machine: up to ``START_LIMIT_S``), so a slow start is never taken for a hang.
    ``on_started(n)`` hears how many workers have started, as the count grows."""
    import ray

    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            trainer.fit()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller as a RunFailed
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True, name="labkit-ray-fit")
    thread.start()
    deadline, started = time.monotonic() + START_LIMIT_S, 0
    try:
        while thread.is_alive() and time.monotonic() < deadline:
            thread.join(1.0)
            if started < world_size:
                with contextlib.suppress(Exception):  # a slow answer is asked again
                    now = ray.get(inbox.started_count.remote(), timeout=10)
                    if on_started is not None and now > started:
                        on_started(now)
                    started = now
                if started >= world_size:
                    deadline = time.monotonic() + limit_s
    except BaseException:  # Ctrl-C: stop every worker now, not at exit
        _stop_now(thread)
        raise
    if not outcome:  # Ray itself is stuck (e.g. waiting for resources): stop this cluster
        from labkit.launchers.ray.session import shutdown_ray

        shutdown_ray()
        load = os.getloadavg()[0]
        what = (f"did not return within {limit_s:g} s after its {world_size} workers started"
                if started >= world_size else f"started {started} of {world_size} workers in "
                f"{START_LIMIT_S:g} s (load average {load:.1f})")
        raise RunTimeout(RankFailure(None, "timeout", f"Ray Train {what}; the Ray cluster "
                                                      f"was shut down"))
    return outcome[0]


def _stop_now(fit: threading.Thread) -> None:
    """An interrupted run: shut the Ray cluster down now (its guard kills what
    ``ray.shutdown`` leaves, ``labkit.launchers.ray.guard``) and let ``trainer.fit()`` end
    with it, so no Ray process outlives the caller and no thread is still inside Ray's
    native code when the interpreter exits (a Ctrl-C at 25 s once ended in a segfault
    there). A second Ctrl-C meanwhile waits for the cleanup."""
    from labkit.launchers.ray.session import shutdown_ray
    from labkit.launchers.reaper import interrupts_deferred

    with interrupts_deferred():
        shutdown_ray()
        fit.join(_FIT_END_S)


def _failure(config: RunConfig, fit_error: BaseException | None, reports: dict[int, Any],
             errors: list[tuple[int, RankFailure]]) -> RunFailed:
    """The root cause (step 4): timeouts, then real errors, then deaths, then echoes."""
    ordered = [f for _, f in sorted(errors, key=lambda x: x[0])]
    timeouts = [f for f in ordered if f.kind == "timeout"]
    if timeouts:
        hung = [f for f in timeouts if "outside" in f.message] or timeouts
        return RunTimeout(RankFailure(hung[0].rank, "timeout", f"run timed out after "
                                      f"{config.timeout_s:g} s: {hung[0].message}",
                                      "\n\n".join(f"--- rank {f.rank} ---\n{f.traceback}"
                                                  for f in timeouts)))
    real = [f for f in ordered if not any(m in f.message + f.traceback for m in _ECHOES)]
    told = {f.rank for f in ordered} | set(reports)
    deaths = [RankFailure(rank, "exit", f"rank {rank} died without reporting an error "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
              for rank, exc in sorted(getattr(fit_error, "worker_failures", {}).items())
              if rank not in told]
    chosen = real + deaths + [f for f in ordered if f not in real]
    if not chosen:
        chosen = [RankFailure(None, "exception", f"Ray Train failed: {type(fit_error).__name__}: "
                              f"{fit_error}")]
    return RunFailed(chosen[0], chosen[1:])
