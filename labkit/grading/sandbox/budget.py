"""What a graded notebook may still spend, and the lines that say which limit stopped a cell.

Each cell has a wall limit (``cell_timeout`` / ``test_timeout``) and a CPU limit
(:class:`~labkit.grading.sandbox.limits.Limits`: ``cell_cpu_s`` / ``test_cpu_s``); the
notebook as a whole has ``notebook_timeout`` and ``notebook_cpu_s``, so a submission whose
every cell hangs just under its limit still ends, with a score, in bounded time. CPU is
read from outside the boxes (:mod:`procfs`), over all the notebook's boxes. A limit that
stopped something becomes a line starting with ``NOTE`` in that cell's output: the
student reads in the feedback why the cell stopped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from labkit.grading.sandbox.box import Box, BoxLimit
from labkit.grading.sandbox.limits import Limits

NOTE = "labkit grading limit: "
"""Every line a limit adds to a cell's output starts so (feedback shows it)."""


class Budget:
    """The notebook's clock and CPU meter; ``cpu_s`` reads every box, ``main`` the main one."""

    def __init__(self, limits: Limits, cpu_s: Callable[[], float],
                 main: Callable[[], Box | None]):
        self.limits, self.cpu_s, self.main = limits, cpu_s, main
        self.notes: list[str] = []
        self.started = time.monotonic()
        self.cpu_start = 0.0
        self.cpu_limit = limits.cell_cpu_s

    def begin(self, cpu_limit: float) -> None:
        self.notes = []
        self.cpu_start, self.cpu_limit = self.cpu_s(), cpu_limit

    def left(self) -> str | None:
        """Why the notebook may run nothing more (its wall or CPU budget is spent), or None."""
        if time.monotonic() - self.started >= self.limits.notebook_timeout:
            return f"the notebook used its {self.limits.notebook_timeout:g} s of time"
        if self.cpu_s() >= self.limits.notebook_cpu_s:
            return f"the notebook used its {self.limits.notebook_cpu_s:g} CPU seconds"
        return None

    def watch(self) -> None:
        """Called while a box works: stop it when the cell or the notebook is over budget."""
        used = self.cpu_s()
        if used - self.cpu_start > self.cpu_limit:
            raise BoxLimit("cpu", f"this cell used more than {self.cpu_limit:g} CPU seconds")
        if used > self.limits.notebook_cpu_s:
            raise BoxLimit("notebook", f"the notebook used its {self.limits.notebook_cpu_s:g} "
                           "CPU seconds")
        box = self.main()
        if box is not None and box.alive() and box.cgroup is None:
            tasks = box.tasks  # no pids cgroup: counted from outside, in cpu_s's reading
            if tasks > self.limits.processes:
                raise BoxLimit("pids", f"the box ran {tasks} processes and threads")

    def wall(self, limit: float) -> float:
        left = self.limits.notebook_timeout - (time.monotonic() - self.started)
        return max(1.0, min(limit, left))

    def hits(self, box: Box, before: dict[str, int], error: Mapping[str, Any] | None
              ) -> list[str]:
        """What stopped this cell, from the box's counters and the error it raised."""
        after = box.hits()
        ename = str((error or {}).get("ename", ""))
        evalue = str((error or {}).get("evalue", ""))
        lim = self.limits
        found = []
        if after.get("pids", 0) > before.get("pids", 0) or ename == "BlockingIOError" \
                or "Resource temporarily unavailable" in evalue:
            found.append(f"more than {lim.processes} processes and threads at once (a fork "
                         "that never stops?)")
        if after.get("oom", 0) > before.get("oom", 0) or ename == "MemoryError" or \
                "annot allocate memory" in evalue:
            found.append(f"more memory than the {lim.memory_mb} MiB a box may use")
        if after.get("tmp_full", 0) or "No space left on device" in evalue or \
                "File too large" in evalue:
            found.append(f"a full /tmp (the box's /tmp holds {lim.tmp_mb} MiB)")
        return found

    def noted(self, what: list[str], how: str) -> None:
        for item in what:
            self.notes.append(f"{NOTE}this cell ran into {item}; {how}")
