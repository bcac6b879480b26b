"""What crosses between a launcher and its ranks: the ``Job`` every rank runs and the
``RankReport`` each one sends back. Plain data, torch-free (the supervisor pickles a job
and unpickles reports without importing torch).

A job is resolved once, when it is built (``labkit.launchers.jobs``): the backend, and for a
``RunJob`` the config, the rank grid and the strategy's entry point, are fields here, so a
rank reads them and never looks them up again. A ``LaunchJob`` carries a function instead;
each kind holds only what it has, so no field is None for the other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from labkit.base.events import Event
from labkit.base.grid import Grid
from labkit.rank.pinning import Pinning

if TYPE_CHECKING:
    from labkit.config.run import RunConfig


@dataclass(kw_only=True)
class Job:
    """What every rank of any start needs, pickled (with cloudpickle) by the supervisor: a
    ``RunJob`` (``labkit.run``) or a ``LaunchJob`` (``labkit.launch``) adds what it runs."""

    backend: str = "gloo"
    """gloo or nccl (never auto: resolved when the job is built)."""
    threads: int = 1
    """Torch threads per rank."""
    timeout_s: float = 60.0
    """The run's limit, seconds."""
    seed: int = 0
    """The run's seed (each rank derives its own)."""
    trace: bool = True
    """Record the ranks' events."""


@dataclass(kw_only=True)
class RunJob(Job):
    """A strategy's run of a resolved config (``labkit.launchers.jobs.job_for``)."""

    config: RunConfig
    """The run's resolved config: each rank's ``RunContext.config``."""
    grid: Grid
    """How the ranks are laid out (dp x pp x tp)."""
    entry: str
    """The strategy's rank code, "module:function" (``Strategy.entry_for``)."""


@dataclass(kw_only=True)
class LaunchJob(Job):
    """A function run on every rank as ``fn(ctx, *args)`` (``labkit.launch``, code exercises),
    on one flat group with no grid axis."""

    fn: Callable[..., Any]
    """What each rank calls with its ``RankContext``."""
    args: tuple[Any, ...] = ()
    """The arguments after ``ctx``."""


@dataclass
class RankReport:
    """What one rank sends back to the supervisor."""

    rank: int
    host: str
    events: list[Event]
    output: Any
    pinning: Pinning | None = None
    """The cores this rank was pinned to for the job, or why not (``labkit.rank.pinning``)."""
