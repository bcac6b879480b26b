"""``labkit.run(config) -> RunResult`` and ``labkit.launch(fn, world_size) -> LaunchResult``.

``run`` trains a registered strategy on real ranks and returns everything a lesson shows:
the merged per-rank ``Timeline``, the losses, the strategy's metrics and the hash of the
final parameters. ``launch`` runs any function (one a student wrote in a notebook cell,
shipped by value) on N ranks and returns what each rank returned, with the timeline.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.analysis.timeline import Timeline
from labkit.base import devices
from labkit.base.errors import ConfigError, RunFailed
from labkit.base.validate import bool_problem, int_problem, local_world_size_problem, real_problem
from labkit.config.run import MAX_THREADS, MAX_TIMEOUT_S, SEED_MAX, RunConfig
from labkit.launchers.supervisor import supervise
from labkit.rank.context import Job, RankOutput, RankReport


@dataclass
class RunResult:
    """The outcome of one ``labkit.run``."""

    config: RunConfig
    backend: str
    timeline: Timeline
    losses: list[float]
    """Per step, the mean over ranks that computed a loss."""
    metrics: dict[str, Any]
    wall_s: float
    """Seconds from the call to the last rank reaped (includes process start-up)."""
    params_sha256: str | None
    outputs: list[RankOutput] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    """What each rank printed (stdout and stderr), by rank."""
    trace_path: str | None = None

    @property
    def step_time_s(self) -> float:
        """Median step time (first step skipped: it pays for warm-up)."""
        return self.timeline.median_step_s()

    def save_trace(self, path: str | Path) -> str:
        """Write the Chrome / Perfetto trace (open it at ui.perfetto.dev or chrome://tracing)."""
        self.timeline.to_chrome(path)
        self.trace_path = str(path)
        return self.trace_path

    def to_json(self) -> dict[str, Any]:
        return {"strategy": self.config.strategy, "world_size": self.config.world_size,
                "backend": self.backend, "steps": self.config.steps,
                "wall_s": round(self.wall_s, 4), "step_time_s": self.step_time_s,
                "losses": self.losses, "metrics": self.metrics, "trace": self.trace_path,
                "params_sha256": self.params_sha256, "config": self.config.to_json()}

    def __repr__(self) -> str:
        last = f"{self.losses[-1]:.4f}" if self.losses else "n/a"
        return (f"RunResult(strategy={self.config.strategy!r}, world_size="
                f"{self.config.world_size}, backend={self.backend!r}, steps="
                f"{self.config.steps}, final_loss={last}, step_time={self.step_time_s*1e3:.2f} "
                f"ms, wall={self.wall_s:.2f} s)")


@dataclass
class LaunchResult:
    """What ``launch`` returns: every rank's return value and the merged timeline."""

    results: list[Any]
    timeline: Timeline
    wall_s: float
    logs: list[str] = field(default_factory=list)
    """What each rank printed (stdout and stderr), by rank."""


def _warn_oversubscribed(world_size: int, backend: str) -> None:
    cores = devices.cpu_count()
    if backend == "gloo" and world_size > cores:
        import warnings

        warnings.warn(f"world_size ({world_size}) > CPU cores ({cores}): ranks share cores, so "
                      f"timings include waiting for a core; results are still correct",
                      stacklevel=4)


def _interactive() -> bool:
    """True in a Jupyter kernel or when stderr is a terminal (where a bar can redraw)."""
    import sys

    if "ipykernel" in sys.modules:
        return True
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def _progress_bar(total: int, enabled: bool | None, desc: str) -> Any:
    if enabled is False or (enabled is None and not _interactive()):
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="step", delay=0 if enabled else 2.0, leave=False)


Executor = Callable[[Job, int, float, Any], "tuple[list[RankReport], list[str]]"]
"""Runs a job on N ranks: ``(job, world_size, timeout_s, on_progress) -> (reports, logs)``
or ``RunFailed``. ``supervise`` starts fresh ranks; ``labkit.Pool`` hands it to warm ones."""


def run(config: RunConfig | None = None, /, **kwargs: Any) -> RunResult:
    """Run a strategy on real ranks: ``labkit.run(strategy="ddp", world_size=2)``."""
    config = make_config(config, kwargs)
    if config.launcher == "ray":  # Ray Train starts the same ranks (labkit.launchers.ray.launcher)
        _check_local(config)
        from labkit.launchers.ray.launcher import run_on_ray

        return run_on_ray(config)  # type: ignore[no-any-return]
    if config.nodes > 1:  # emulated nodes: one torchrun agent per network namespace
        _check_local(config)
        from labkit.launchers.cluster.launcher import run_cluster

        backend = config.resolved_backend()
        _warn_oversubscribed(config.world_size, backend)
        return run_cluster(config, backend)  # type: ignore[no-any-return]
    return run_config(config, supervise)


def _check_local(config: RunConfig) -> None:
    too_many = local_world_size_problem(config.world_size)  # every rank starts on this host
    if too_many is not None:
        raise ConfigError(too_many)


def make_config(config: RunConfig | None, kwargs: dict[str, Any]) -> RunConfig:
    """``RunConfig(**kwargs)``, or ``config`` with ``kwargs`` replaced (validated either way)."""
    if config is None:
        return RunConfig(**kwargs)
    return config.replace(**kwargs) if kwargs else config


def run_config(config: RunConfig, execute: Executor, threads: int | None = None) -> RunResult:
    """Run a validated config through ``execute``, with a progress bar where one can show."""
    _check_local(config)
    backend = config.resolved_backend()
    _warn_oversubscribed(config.world_size, backend)
    job = job_for(config, backend, threads)
    total = config.steps * config.world_size
    bar = _progress_bar(total, config.progress, f"{config.strategy} x{config.world_size}")
    on_progress = None
    if bar is not None:
        def on_progress(done: int) -> None:
            bar.update(done - bar.n)
    t0 = time.monotonic()
    try:
        reports, logs = execute(job, config.world_size, config.timeout_s, on_progress)
    except RunFailed as err:
        if err.timeline is not None:  # what the ranks recorded before the failure
            err.timeline.meta.update({"config": config.to_json(), "backend": backend})
        raise
    finally:
        if bar is not None:
            bar.close()
    result = collect(config, backend, reports, time.monotonic() - t0)
    result.logs = logs
    return result


def job_for(config: RunConfig, backend: str, threads: int | None = None) -> Job:
    """What every rank of a run of ``config`` needs (whichever launcher starts them)."""
    from labkit.config import registry
    return Job(config=config, backend=backend, threads=threads or config.threads(),
               timeout_s=config.timeout_s, seed=config.seed, trace=config.trace,
               grid=registry.get(config.strategy).grid_for(config))


def collect(config: RunConfig, backend: str, reports: list[RankReport], wall: float
            ) -> RunResult:
    """Every rank's report -> one ``RunResult``: the merged timeline, the losses, the
    strategy's metrics combined from each rank's typed record, and throughput."""
    from labkit.config import registry
    from labkit.config.metrics import combine_records, throughput

    outputs: list[RankOutput] = [r.output for r in reports]
    events = sorted((e for r in reports for e in r.events), key=lambda e: (e.start_ns, e.rank))
    hosts = sorted({r.host for r in reports})
    grid = registry.get(config.strategy).grid_for(config)
    timeline = Timeline(events, config.world_size,
                        {"config": config.to_json(), "backend": backend, "hosts": hosts,
                         "grid": {"dp": grid.dp, "pp": grid.pp, "tp": grid.tp}})
    per_step = [o.losses for o in outputs if o.losses]
    losses = [statistics.fmean(vals) for vals in zip(*per_step)] if per_step else []
    metrics: dict[str, Any] = dict(timeline.summary()) if config.trace else {}
    for o in outputs:  # free-form metrics: rank 0's view wins on clashes
        for k, v in o.metrics.items():
            metrics.setdefault(k, v)
    for k, v in outputs[0].metrics.items():
        metrics[k] = v
    metrics.update(combine_records([o.record for o in outputs], config))
    for o in outputs:  # each rank's own view stays readable as outputs[r].metrics
        o.metrics = o.all_metrics()
    step_time = timeline.median_step_s() if config.trace else metrics.get("step_wall_s", 0.0)
    metrics.update(throughput(metrics, step_time, config.world_size, backend))
    sha = next((o.params_sha256 for o in outputs if o.params_sha256), None)
    return RunResult(config=config, backend=backend, timeline=timeline, losses=losses,
                     metrics=metrics, wall_s=wall, params_sha256=sha, outputs=outputs)


def launch_problems(fn: Any, world_size: Any, backend: Any, timeout_s: Any, seed: Any,
                    threads_per_rank: Any, trace: Any) -> list[str]:
    """Every rule ``launch``'s arguments break (the same rules as ``RunConfig``'s fields)."""
    checks = [
        local_world_size_problem(world_size),
        None if backend in ("gloo", "nccl") else
        f"backend {backend!r} must be 'gloo' or 'nccl' for launch",
        real_problem("timeout_s", timeout_s, MAX_TIMEOUT_S, unit=" seconds", example=60),
        int_problem("seed", seed, 0, SEED_MAX, example=0),
        None if threads_per_rank is None else int_problem(
            "threads_per_rank", threads_per_rank, 1, MAX_THREADS, example=1),
        bool_problem("trace", trace),
        None if callable(fn) else f"fn ({fn!r}) must be callable as fn(ctx, *args)",
    ]
    return [p for p in checks if p is not None]


def launch(fn: Callable[..., Any], world_size: int = 2, *args: Any, backend: str = "gloo",
           timeout_s: float = 60.0, seed: int = 0, threads_per_rank: int | None = None,
           trace: bool = True) -> LaunchResult:
    """Run ``fn(ctx, *args)`` on ``world_size`` real ranks; ``fn`` may be defined in a notebook.

    ``ctx`` is a ``labkit.rank.context.RankContext``: ``ctx.rank``, ``ctx.world_size``, ``ctx.comm``
    (traced send / recv / collectives) and ``ctx.tracer``. Return plain values, numpy arrays
    or tensors (of any size: results travel by value). A rank that returns nothing but
    exits (``os._exit``, ``sys.exit``) is reported as that rank's failure.
    """
    job = launch_job(fn, world_size, args, backend=backend, timeout_s=timeout_s, seed=seed,
                     threads_per_rank=threads_per_rank, trace=trace)
    return launch_with(job, world_size, supervise)


def launch_job(fn: Callable[..., Any], world_size: int, args: tuple[Any, ...], *,
               backend: str, timeout_s: float, seed: int, threads_per_rank: int | None,
               trace: bool) -> Job:
    """The validated job of a ``launch`` (``ConfigError`` before any process starts)."""
    problems = launch_problems(fn, world_size, backend, timeout_s, seed, threads_per_rank,
                               trace)
    if problems:
        raise ConfigError(problems)
    threads = threads_per_rank or devices.default_threads_per_rank(world_size)
    return Job(fn=fn, args=args, backend=backend, threads=threads, timeout_s=timeout_s,
               seed=seed, trace=trace)


def launch_with(job: Job, world_size: int, execute: Executor) -> LaunchResult:
    """Run a launch's job through ``execute`` and merge what the ranks returned."""
    t0 = time.monotonic()
    reports, logs = execute(job, world_size, job.timeout_s, None)
    events = sorted((e for r in reports for e in r.events), key=lambda e: (e.start_ns, e.rank))
    return LaunchResult([r.output for r in reports], Timeline(events, world_size),
                        time.monotonic() - t0, logs)

