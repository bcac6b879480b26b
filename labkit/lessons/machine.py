"""What the machine was doing while a lesson measured: the words a lesson uses when its run
contradicts the rule it teaches.

A lesson's prose states a rule ("with a straggler, ASP reaches the target first"); the cell
beside it prints what *this* run showed. Where the run disagrees, the usual reason on a
laptop is not the rule but the cores: other programs (or more ranks than cores) took turns
on them, and a rank waiting for a core looks like a slow rank or a slow message. These
helpers read the load average (``os.getloadavg``: runnable processes, averaged over a
minute) before a lesson's runs start, so the sentence can say how busy the machine was.
``sharing_cores`` silences the launcher's "ranks share cores" warning inside a lesson's
driver: a lesson that runs more ranks than cores on purpose says so once, in its own words,
instead of a red box under every cell. Torch-free, no processes.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

from labkit.base.devices import cpu_count


@dataclass(frozen=True)
class Load:
    """The machine's load average and cores, read just before a lesson's runs."""

    load: float
    """1-minute load average (runnable processes); nan where the OS has none."""
    cores: int

    @property
    def busy(self) -> bool:
        """Other programs wanted at least half the cores before the lesson's own ranks came."""
        return self.load == self.load and self.load >= 0.5 * self.cores

    def text(self) -> str:
        if self.load != self.load:
            return f"{self.cores} cores"
        return f"load average {self.load:.1f} on {self.cores} cores"


def load_now() -> Load:
    """The load average before a run (nan where ``os.getloadavg`` is missing)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = float("nan")
    return Load(load, cpu_count())


NOT_DEDICATED = "the rule is about ranks with a core each, which this run did not have"
"""The end of every ``why_not`` sentence (the notebook checks look for it)."""


def why_not(load: Load, ranks: int) -> str:
    """The sentence a lesson adds when its run contradicts the rule: how many processes
    shared how many cores, and how busy the machine already was."""
    parts = [f"{ranks} ranks shared {load.cores} cores"]
    if load.busy:
        parts.append(f"and other programs kept the machine busy ({load.text()})")
    return (" ".join(parts) + ": a rank waiting for a core looks like a slow rank or a slow "
            "message, and that waiting is not in the formula; " + NOT_DEDICATED)


OVERSUBSCRIBED = r"world_size \(\d+\) > CPU cores"
"""The start of ``labkit.launchers.jobs.warn_oversubscribed``'s message."""


@contextlib.contextmanager
def sharing_cores() -> Iterator[None]:
    """Runs inside this block do not warn that their ranks share the cores: the lesson that
    starts them says it in its own words (every other warning still shows)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=OVERSUBSCRIBED, category=UserWarning)
        yield
