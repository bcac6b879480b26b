"""Running a job on N ranks through an executor, with a progress bar where one can show.

``run_config`` and ``launch_with`` take the executor as an argument: ``supervise`` starts
fresh ranks (``labkit.launchers.supervisor``), a ``labkit.Pool`` hands the job to its warm
ones. Both validate first, resolve the job once (``labkit.launchers.jobs``) and build the
result the same way (``labkit.launchers.results``). ``labkit.run`` / ``labkit.launch``
(``labkit.api``) pick which launcher runs a config.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from labkit.base.errors import RunFailed
from labkit.base.progress import bar as _progress_bar  # tests stub it here
from labkit.base.progress import clock as _progress_clock
from labkit.base.progress import showing
from labkit.config.run import RunConfig
from labkit.launchers.jobs import check_local, job_for, warn_oversubscribed
from labkit.launchers.results import LaunchResult, RunResult, collect, launch_result
from labkit.rank.job import Job, LaunchJob, RankReport

Executor = Callable[[Job, int, float, Any], "tuple[list[RankReport], list[str]]"]
"""Runs a job on N ranks: ``(job, world_size, timeout_s, on_progress) -> (reports, logs)``
or ``RunFailed``. ``supervise`` starts fresh ranks; ``labkit.Pool`` hands it to warm ones."""


def run_config(config: RunConfig, execute: Executor, threads: int | None = None) -> RunResult:
    """Run a validated config through ``execute``, with a progress bar where one can show."""
    check_local(config)
    job = job_for(config, threads=threads)
    warn_oversubscribed(config.world_size, job.backend)
    total = config.steps * config.world_size
    bar = _progress_bar(total, config.progress, f"{config.strategy} x{config.world_size}")
    on_progress = None
    if bar is not None:
        def on_progress(done: int) -> None:
            bar.update(done - bar.n)
    t0 = time.monotonic()
    try:
        with showing(bar):
            reports, logs = execute(job, config.world_size, config.timeout_s, on_progress)
    except RunFailed as err:
        if err.timeline is not None:  # what the ranks recorded before the failure
            err.timeline.meta.update({"config": config.to_json(), "backend": job.backend})
        raise
    result = collect(job, reports, time.monotonic() - t0)
    result.logs = logs
    return result


def launch_with(job: LaunchJob, world_size: int, execute: Executor,
                progress: bool | None = None) -> LaunchResult:
    """Run a launch's job through ``execute`` and merge what the ranks returned. Where one can
    see it, a launch that lasts over two seconds shows its time so far (and the steps its
    ranks marked with ``ctx.step``): its start-up and its work may be seconds of silence
    otherwise. ``progress`` follows ``labkit.base.progress``'s rule."""
    name = getattr(job.fn, "__name__", "function")
    shown = _progress_clock(f"{name} on {world_size} ranks", progress)
    on_progress = None
    if shown is not None:
        def on_progress(done: int) -> None:
            if done:
                shown.set_postfix_str(f"{done} steps", refresh=False)
            shown.update(0)  # redraws now (at most ten times a second)
    t0 = time.monotonic()
    with showing(shown):  # the time moves on while ranks start, too
        reports, logs = execute(job, world_size, job.timeout_s, on_progress)
    return launch_result(reports, world_size, time.monotonic() - t0, logs)
