"""What ``labkit submit`` shows while nbgrader grades: a line per phase and per cell.

nbgrader grades in a process of its own and tells what it does only in its log (stderr).
The grading preprocessor (``labkit.grading.sandbox.execute``) logs a line as each code
cell starts (``grading cell 3 of 12 (q1_mean, box)``) and as it ends (``cell 3 (q1_mean,
box): 0.41 s``, the line ``bench/bench_grading.py`` reads). ``Narrator`` turns those lines
into progress lines, and when nothing new was said for ``quiet_s`` seconds it says how long
the current cell (or phase) has run: a code exercise that starts real ranks takes tens of
seconds, and starting the kernel several.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from labkit.base.progress import every

START = re.compile(r"grading cell (\d+) of (\d+) \(([^,]+), (test|box)\)")
END = re.compile(r"cell (\d+) \(([^,]+), (test|box)\): ([\d.]+) s")
SANDBOX = re.compile(r"grading (\S+) in a '(\w+)' sandbox")
SLOW_S = 5.0
"""A cell that took at least this long gets a line when it ends, with its time."""


class Narrator:
    """nbgrader's log lines in, progress lines out (through ``say``)."""

    def __init__(self, say: Callable[[str], None], quiet_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic):
        self.say, self.quiet_s, self.clock = say, quiet_s, clock
        self.doing, self.since = "", clock()
        self.last = self.since
        self._lock = threading.Lock()  # the log reader and the ticker both speak

    def _tell(self, text: str, doing: str | None = None) -> None:
        with self._lock:
            now = self.clock()
            if doing is not None:
                self.doing, self.since = doing, now
            self.last = now
            self.say(text)

    def phase(self, text: str, doing: str) -> None:
        """A phase starts: ``text`` says which; ``doing`` ("in nbgrader autograde") is what
        the ticker says it is still doing, counting from now."""
        self._tell(text, doing=doing)

    def line(self, log_line: str) -> None:
        """One line of nbgrader's log: a cell starting or ending, the sandbox it runs in."""
        start, end, box = (START.search(log_line), END.search(log_line),
                           SANDBOX.search(log_line))
        if start:
            n, total, gid, kind = start.groups()
            what = ("its tests, run by the grader" if kind == "test"
                    else "your code, in the sandbox")
            name = f"{gid} " if gid != "-" else ""
            self._tell(f"  cell {n}/{total}: {name}({what})",
                       doing=f"on cell {n}/{total}" + (f" ({gid})" if gid != "-" else ""))
        elif end and float(end.group(4)) >= SLOW_S:
            self._tell(f"  cell {end.group(1)} took {float(end.group(4)):.0f} s")
        elif box:
            self._tell(f"  running {box.group(1)} in a '{box.group(2)}' sandbox")

    def tick(self) -> None:
        """Say how long the current step has run, if nothing was said for ``quiet_s``."""
        with self._lock:
            now = self.clock()
            if not self.doing or now - self.last < self.quiet_s:
                return
            self.last = now
            self.say(f"  ... still {self.doing}: {now - self.since:.0f} s")

    def ticking(self, every_s: float = 1.0) -> AbstractContextManager[None]:
        """Call ``tick`` every ``every_s`` seconds while the block runs (nbgrader does)."""
        return every(every_s, self.tick)
