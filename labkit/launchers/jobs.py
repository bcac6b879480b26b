"""A run's config resolved once into the ``Job`` every rank reads, and the rules a
launch's arguments must pass, checked before any process starts.

``job_for`` is the one place that turns ``auto`` into a backend, finds the strategy's rank
grid and entry point, and picks the torch threads per rank; launchers hand the job on as
it is (pickled to fresh ranks, sent to warm ones, given to Ray Train's workers), and
``collect`` reads the same job back when the reports come in.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

from labkit.base import devices
from labkit.base.errors import ConfigError
from labkit.base.files import dir_problem
from labkit.base.validate import (
    MAX_LOCAL_WORLD_SIZE,
    bool_problem,
    comm_wait_problem,
    is_int,
    local_world_size_problem,
)
from labkit.config import registry
from labkit.config.rules import settings_problems
from labkit.config.run import RunConfig
from labkit.rank.job import LaunchJob, RunJob


def warn_oversubscribed(world_size: int, backend: str, stacklevel: int = 4) -> None:
    cores = devices.cpu_count()
    if backend == "gloo" and world_size > cores:
        warnings.warn(f"world_size ({world_size}) > CPU cores ({cores}): ranks share cores, so "
                      f"timings include waiting for a core; results are still correct",
                      stacklevel=stacklevel)


def cwd_problem() -> str | None:
    """Ranks start in the caller's working directory: it must still exist."""
    try:
        os.getcwd()
    except FileNotFoundError:
        return ("the working directory no longer exists (it was deleted or moved after this "
                "shell or kernel entered it), so no rank can start in it; cd to an existing "
                "directory and run again, e.g. cd ~")
    return None


def checkpoint_dir_problem(config: RunConfig) -> str | None:
    """A run that saves checkpoints must be able to, before its ranks train up to the first
    save: the directory (created if missing) takes a file and has room
    (``labkit.base.files.dir_problem``)."""
    root = getattr(config.options, "checkpoint_dir", None)
    if not root or not getattr(config.options, "checkpoint_every", 0):
        return None
    why = dir_problem(root)
    if why is None:
        return None
    return (f"checkpoint_dir {str(root)!r} {why}; checkpoints need a writable directory with "
            f"room to save, e.g. checkpoint_dir='ckpt' (--checkpoint-dir ckpt)")


def check_local(config: RunConfig) -> None:
    """What a run needs on this host, checked before any process starts: every rank starts
    here (at most ``MAX_LOCAL_WORLD_SIZE`` of them, in a working directory that exists, told
    a way of waiting they know: ``LABKIT_COMM_WAIT``) and its checkpoint directory can be
    written."""
    problems = [p for p in (local_world_size_problem(config.world_size), cwd_problem(),
                            comm_wait_problem(), checkpoint_dir_problem(config))
                if p is not None]
    if problems:
        raise ConfigError(problems)


def make_config(config: RunConfig | None, kwargs: dict[str, Any]) -> RunConfig:
    """``RunConfig(**kwargs)``, or ``config`` with ``kwargs`` replaced (validated either way)."""
    if config is None:
        return RunConfig(**kwargs)
    return config.replace(**kwargs) if kwargs else config


def job_for(config: RunConfig, backend: str | None = None, threads: int | None = None
            ) -> RunJob:
    """What every rank of a run of ``config`` needs, whichever launcher starts them: the
    backend (``config.resolved_backend()`` unless a launcher resolved it per node, as
    torchrun's worker does), the rank grid, the strategy's entry point and the threads."""
    spec = registry.get(config.strategy)
    return RunJob(config=config, backend=backend or config.resolved_backend(),
               threads=threads or config.threads(), timeout_s=config.timeout_s,
               seed=config.seed, trace=config.trace, grid=spec.grid_for(config),
               entry=spec.entry_for(config))


def launch_world_size_problem(world_size: Any) -> str | None:
    """``launch(fn, world_size)``'s rule, worded for a call: a count of ranks is a whole
    number (``labkit.launch(fn, 2.5)`` names the type, not "float ranks")."""
    if not is_int(world_size):
        return (f"world_size ({world_size!r}) must be a whole number of ranks, an int from 1 "
                f"to {MAX_LOCAL_WORLD_SIZE} (ranks on one machine), not a "
                f"{type(world_size).__name__}; e.g. labkit.launch(fn, 2)")
    return local_world_size_problem(world_size)


def launch_problems(fn: Any, world_size: Any, backend: Any, timeout_s: Any, seed: Any,
                    threads_per_rank: Any, trace: Any, progress: Any = None) -> list[str]:
    """Every rule ``launch``'s arguments break: its own (a callable, a whole number of
    ranks, an explicit backend) and those it shares with ``RunConfig``
    (``labkit.config.rules.settings_problems``)."""
    checks = [
        launch_world_size_problem(world_size),
        None if backend in ("gloo", "nccl") else
        f"backend {backend!r} must be 'gloo' or 'nccl' for launch",
        *settings_problems(timeout_s=timeout_s, seed=seed, threads_per_rank=threads_per_rank,
                           trace=trace),
        bool_problem("progress", progress, optional=True),
        None if callable(fn) else f"fn ({fn!r}) must be callable as fn(ctx, *args)",
        cwd_problem(),
        comm_wait_problem(),
    ]
    return [p for p in checks if p is not None]


def launch_job(fn: Callable[..., Any], world_size: int, args: tuple[Any, ...], *,
               backend: str, timeout_s: float, seed: int, threads_per_rank: int | None,
               trace: bool, progress: bool | None = None) -> LaunchJob:
    """The validated job of a ``launch`` (``ConfigError`` before any process starts);
    ``progress`` is checked here and shown by ``labkit.launchers.runner.launch_with``."""
    problems = launch_problems(fn, world_size, backend, timeout_s, seed, threads_per_rank,
                               trace, progress)
    if problems:
        raise ConfigError(problems)
    threads = threads_per_rank or devices.default_threads_per_rank(world_size)
    return LaunchJob(fn=fn, args=args, backend=backend, threads=threads, timeout_s=timeout_s,
                     seed=seed, trace=trace)
