"""What the machine was doing while a lesson measured: the words a lesson uses when its run
contradicts the rule it teaches.

A lesson's prose states a rule ("with a straggler, ASP reaches the target first"); the cell
beside it prints what *this* run showed. Where the run disagrees, the usual reason on a
laptop is not the rule but the cores: other programs (or more ranks than cores) took turns
on them, and a rank waiting for a core looks like a slow rank or a slow message. These
helpers read how much CPU other programs used (``labkit.base.cpuload``: everyone's CPU time
less the lesson's own tree, over half a second), so the sentence can say how busy the machine
was without counting the lesson's own ranks, as the load average would for a minute.
``sharing_cores`` silences the launcher's "ranks share cores" warning inside a lesson's
driver: a lesson that runs more ranks than cores on purpose says so once, in its own words,
instead of a red box under every cell. Torch-free, no processes.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psutil

from labkit.base.cpuload import busy_limit, others_now
from labkit.base.devices import cpu_count


@dataclass(frozen=True)
class Load:
    """How busy other programs kept the machine, read when a lesson writes its sentence."""

    load: float
    """1-minute load average (runnable processes, the lesson's own ranks included, decaying
    over a minute); nan where the OS has none. Said for context, never judged."""
    cores: int
    others: float = float("nan")
    """Cores' worth of CPU that programs outside the lesson's kernel (and its ranks, pool
    and Ray daemons) used over half a second (``labkit.base.cpuload``); nan: not read."""

    @property
    def busy(self) -> bool:
        """Other programs used more than ``busy_limit`` (a quarter of a core; 15 % of the
        machine from 2 cores up): the lesson's own ranks never count, however recently they
        ran. Without that reading, the load average at half the cores."""
        if self.others == self.others:
            return self.others > busy_limit(self.cores)
        return self.load == self.load and self.load >= 0.5 * self.cores

    def text(self) -> str:
        """"other programs used 1.7 of 2 cores (load average 3.4)", or what is known of it."""
        if self.others == self.others:
            return (f"other programs used {self.others:.1f} of {self.cores} cores"
                    + (f" (load average {self.load:.1f})" if self.load == self.load else ""))
        if self.load == self.load:
            return f"load average {self.load:.1f} on {self.cores} cores"
        return f"{self.cores} cores"


_LAST: list[tuple[float, Load]] = []
FRESH_S = 10.0
"""A reading this recent is reused: a cell that writes five sentences reads the machine once."""


def load_now(fresh: bool = False) -> Load:
    """How busy other programs keep the machine now (``Load``): their CPU over half a
    second, read at most every ``FRESH_S`` (``fresh``: read it again now), and the load
    average beside it."""
    if not fresh and _LAST and time.monotonic() - _LAST[0][0] < FRESH_S:
        return _LAST[0][1]
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = float("nan")
    try:
        others = others_now()
    except (OSError, psutil.Error):
        others = float("nan")
    reading = Load(load, cpu_count(), others)
    _LAST[:] = [(time.monotonic(), reading)]
    return reading


NOT_DEDICATED = ("the rule is about ranks whose every thread has a core of its own, which "
                 "this run did not have")
"""The end of every ``why_not`` sentence (the notebook checks look for it)."""


def why_not(load: Load, ranks: int) -> str:
    """The sentence a lesson adds when its run contradicts the rule: how many processes
    shared how many cores, and how busy the machine already was. Ranks no more than the
    cores still share them: each rank's communication runs in threads of its own (gloo's,
    DDP's reducer), beside the notebook's kernel and the system, so the sentence says that
    instead of "2 ranks shared 2 cores", which a student reads as a core each."""
    if ranks > load.cores:
        parts = [f"{ranks} ranks shared {load.cores} cores"]
    else:
        parts = [f"{ranks} ranks and their communication threads shared {load.cores} cores"]
    if load.busy:
        parts.append(f"and {load.text()}" if load.others == load.others else
                     f"and other programs kept the machine busy ({load.text()})")
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


JUDGED_LOAD = "judged_load"
"""The key of ``RunResult.metrics`` that keeps the machine's load when the run was first
judged (``judged_load``)."""


def judged_load(run: Any) -> Load:
    """How busy other programs kept the machine when ``run`` was first judged
    (``labkit.lessons.machine.load_now``), kept in its metrics: judging it again later (the
    notebook's checks) reads the same load, and so gives the same verdict."""
    kept = run.metrics.get(JUDGED_LOAD)
    if kept is None:
        now = load_now()
        kept = run.metrics[JUDGED_LOAD] = {"load": now.load, "cores": now.cores,
                                           "others": now.others}
    return Load(kept["load"], kept["cores"], kept["others"])
