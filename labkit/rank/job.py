"""What crosses between a launcher and its ranks: the ``Job`` every rank runs and the
``RankReport`` each one sends back. Plain data, torch-free (the supervisor pickles a job
and unpickles reports without importing torch).

A job is resolved once, when it is built (``labkit.launchers.jobs.job_for``): the backend,
the rank grid and the strategy's entry point are fields here, so a rank reads them and
never looks them up again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from labkit.base.events import Event
from labkit.base.grid import Grid
from labkit.rank.pinning import Pinning

if TYPE_CHECKING:
    from labkit.config.run import RunConfig


@dataclass
class Job:
    """Everything a rank needs, pickled (with cloudpickle) by the supervisor."""

    config: RunConfig | None = None
    fn: Any = None
    """A function run on every rank as ``fn(ctx, *args)`` (code exercises); else the strategy."""
    args: tuple[Any, ...] = ()
    backend: str = "gloo"
    threads: int = 1
    timeout_s: float = 60.0
    seed: int = 0
    trace: bool = True
    grid: Grid | None = None
    """How the ranks are laid out (dp x pp x tp); None: one flat group with no axis."""
    entry: str | None = None
    """The strategy's rank code, "module:function" (``Strategy.entry``); None for ``fn``."""


@dataclass
class RankReport:
    """What one rank sends back to the supervisor."""

    rank: int
    host: str
    events: list[Event]
    output: Any
    pinning: Pinning | None = None
    """The cores this rank was pinned to for the job, or why not (``labkit.rank.pinning``)."""
