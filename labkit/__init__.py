"""labkit — a teaching lab for distributed deep-learning training on real ranks.

Start here::

    import labkit
    result = labkit.run(strategy="ddp", world_size=2, steps=10)
    labkit.plot_timeline(result.timeline)

    pool = labkit.pool(2)                  # warm ranks: the next runs skip the start-up
    again = pool.run(strategy="ddp", world_size=2, steps=10)

Names are imported lazily, so ``import labkit`` is instant and the supervisor process never
pays for torch; the ranks import what they need.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "run": "labkit.api", "launch": "labkit.api",
    "RunResult": "labkit.launchers.results", "LaunchResult": "labkit.launchers.results",
    "Pool": "labkit.launchers.pool", "pool": "labkit.launchers.pool",
    "RunConfig": "labkit.config.run", "ModelConfig": "labkit.config.run",
    "FaultSpec": "labkit.config.run",
    "Timeline": "labkit.analysis.timeline", "Event": "labkit.base.events",
    "Lane": "labkit.base.events", "Op": "labkit.base.events",
    "SCHEMA_VERSION": "labkit.base.events",
    "LabError": "labkit.base.errors", "ConfigError": "labkit.base.errors",
    "RunFailed": "labkit.base.errors", "RunTimeout": "labkit.base.errors",
    "plot_timeline": "labkit.analysis.plots", "timeline_viewer": "labkit.widgets.timeline",
    "doctor": "labkit.doctor",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'labkit' has no attribute {name!r}")
    loaded = importlib.import_module(module)
    # labkit.doctor is a submodule named like its function, and ``import labkit.doctor`` puts
    # the module here whatever we cache; that module is callable, so keep it
    value = loaded if module == f"{__name__}.{name}" else getattr(loaded, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
