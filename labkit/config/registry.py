"""The open registry of training strategies (``labkit run STRATEGY``).

A strategy family is a subpackage of ``labkit.strategies`` whose ``__init__`` is
*torch-free*: it imports the family's ``options`` module, which defines the options
dataclass and calls ``register(Strategy(...))``. The
code that runs on each rank lives in a sibling module named by ``Strategy.entry``
("module:function") and is imported only inside the ranks, so the supervisor process stays
light (no torch import) and validates configs instantly.

Adding a strategy never edits this file: drop a subpackage in, it is discovered.

Discovery survives an interrupt (a student's Ctrl-C 0.1 s into the first run of a kernel,
while the packages are still importing): it counts as done only once every package has
imported, so an interrupted discovery simply runs again on the next call; a package whose
import was cut short is not in ``sys.modules`` and re-registers when imported again, which
replaces what it registered before instead of being taken for a second strategy of the
same name.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from labkit.base.errors import ConfigError


@dataclass(frozen=True)
class Strategy:
    """How to run one strategy: what each rank calls and which options it takes."""

    name: str
    entry: str
    """"package.module:function" called on every rank as ``function(ctx) -> RankOutput``."""
    summary: str
    options: type | None = None
    """Keyword-only dataclass of strategy settings (validated in its __post_init__)."""
    check: Callable[[Any], list[str]] | None = None
    """Cross-field rules on the whole RunConfig; returns problem messages (empty if fine)."""
    lesson: str = ""
    axis: str = "dp"
    """The grid axis a run of this strategy spreads its ranks over: dp, pp or tp."""
    grid: Callable[[Any], Any] | None = None
    """For strategies on several axes at once: RunConfig -> ``labkit.base.grid.Grid``."""
    default_world_size: Callable[[Any], int] | None = None
    """options -> the world size a run takes when none is given (default 2)."""
    defaults: dict[str, Any] = field(default_factory=dict)
    """RunConfig settings this strategy uses unless the run sets them (steps, lr, optimizer,
    timeout_s), over the model's defaults (``labkit.config.run.MODEL_DEFAULTS``); ``"model"``
    maps a model kind to the shape this strategy shows its lesson on, e.g.
    ``{"model": {"mlp": {"width": 512, "depth": 8}}}`` (or to a function of the fields
    given, returning that shape)."""
    backends: tuple[str, ...] = ("gloo", "nccl")
    """The backends the strategy runs on; ``backend="auto"`` picks NCCL only if listed."""
    model_entries: dict[str, str] = field(default_factory=dict)
    """Rank code for a model kind that another loop trains, e.g. ``{"gpt":
    "labkit.strategies.hybrid.impl:train"}``: resolved once, when the job is built."""

    def entry_for(self, config: Any) -> str:
        """The rank code a run of ``config`` starts on every rank."""
        return self.model_entries.get(config.model.kind, self.entry)

    def grid_for(self, config: Any) -> Any:
        """The rank grid of a run of this strategy (``labkit.base.grid.Grid``)."""
        from labkit.base.grid import Grid

        if self.grid is not None:
            return self.grid(config)
        return Grid.along(self.axis, config.world_size)


STRATEGIES = "labkit.strategies"
"""The package whose subpackages are strategy families (found by name, not imported here:
the registry sits below the rank code it lists)."""

_REGISTRY: dict[str, Strategy] = {}
_ORIGIN: dict[str, str] = {}
"""Strategy name -> the module that registered it."""
_discovered = False
_lock = threading.RLock()
_discovering: set[int] = set()
"""Threads inside ``_discover`` (a package that looks a strategy up while it imports sees
what is registered so far instead of recursing)."""


def register(spec: Strategy) -> Strategy:
    origin = sys._getframe(1).f_globals.get("__name__", "?")
    with _lock:
        known = _REGISTRY.get(spec.name)
        if known is not None and known != spec and _ORIGIN.get(spec.name) != origin:
            raise ConfigError(f"strategy {spec.name!r} is registered twice (by "
                              f"{_ORIGIN.get(spec.name)} and {origin})")
        # the same module registering again: its import was cut short and is re-run
        _REGISTRY[spec.name] = spec
        _ORIGIN[spec.name] = origin
    return spec


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    me = threading.get_ident()
    with _lock:
        if _discovered or me in _discovering:
            return
        _discovering.add(me)
        try:
            package = importlib.import_module(STRATEGIES)
            for info in pkgutil.iter_modules(package.__path__):
                if info.ispkg:
                    importlib.import_module(f"{STRATEGIES}.{info.name}")
            _discovered = True  # only now: an interrupt above leaves it to the next call
        finally:
            _discovering.discard(me)


def lookup(name: str) -> Strategy | None:
    _discover()
    return _REGISTRY.get(name)


def get(name: str) -> Strategy:
    spec = lookup(name)
    if spec is None:
        raise ConfigError(f"strategy {name!r} is not registered; known: {', '.join(names())}")
    return spec


def names() -> list[str]:
    _discover()
    return sorted(_REGISTRY)
