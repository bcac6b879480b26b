"""``labkit.run`` and ``labkit.launch``: the two calls a notebook makes, and which launcher
serves them.

``run(config)`` trains a registered strategy on real ranks and returns everything a lesson
shows (``RunResult``: the merged per-rank ``Timeline``, the losses, the strategy's metrics,
the hash of the final parameters). It picks the launcher from the config: Ray Train for
``launcher="ray"``, one torchrun agent per emulated node for ``nodes > 1``, else labkit's
own supervisor. ``launch(fn, world_size)`` runs any function (one a student wrote in a
notebook cell, shipped by value) on N ranks and returns what each rank returned, with the
timeline. A warm ``labkit.Pool`` takes the same arguments.

(The module is ``api``, not ``run``: a submodule named ``labkit.run`` would replace the
function of that name on the package when imported.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from labkit.config.run import RunConfig
from labkit.launchers.jobs import check_local, job_for, launch_job, make_config, warn_oversubscribed
from labkit.launchers.results import LaunchResult, RunResult
from labkit.launchers.runner import launch_with, run_config
from labkit.launchers.supervisor import supervise


def run(config: RunConfig | None = None, /, **kwargs: Any) -> RunResult:
    """Run a strategy on real ranks: ``labkit.run(strategy="ddp", world_size=2)``."""
    config = make_config(config, kwargs)
    if config.launcher == "ray":  # Ray Train starts the same ranks (labkit.launchers.ray)
        check_local(config)
        from labkit.launchers.ray.launcher import run_on_ray

        return run_on_ray(job_for(config))
    if config.nodes > 1:  # emulated nodes: one torchrun agent per network namespace
        check_local(config)
        from labkit.launchers.cluster.launcher import run_cluster

        job = job_for(config)
        warn_oversubscribed(config.world_size, job.backend)
        return run_cluster(config, job.backend)  # type: ignore[no-any-return]
    return run_config(config, supervise)


def launch(fn: Callable[..., Any], world_size: int = 2, *args: Any, backend: str = "gloo",
           timeout_s: float = 60.0, seed: int = 0, threads_per_rank: int | None = None,
           trace: bool = True, progress: bool | None = None) -> LaunchResult:
    """Run ``fn(ctx, *args)`` on ``world_size`` real ranks; ``fn`` may be defined in a notebook.

    ``ctx`` is a ``labkit.rank.context.RankContext``: ``ctx.rank``, ``ctx.world_size``, ``ctx.comm``
    (traced send / recv / collectives) and ``ctx.tracer``. Return plain values, numpy arrays
    or tensors (of any size: results travel by value). A rank that returns nothing but
    exits (``os._exit``, ``sys.exit``) is reported as that rank's failure. ``progress``: the
    time so far (and the steps marked with ``ctx.step``), shown as ``labkit.run``'s bar is
    (None: where one can see it, once the launch has lasted two seconds).
    """
    job = launch_job(fn, world_size, args, backend=backend, timeout_s=timeout_s, seed=seed,
                     threads_per_rank=threads_per_rank, trace=trace, progress=progress)
    return launch_with(job, world_size, supervise, progress)
