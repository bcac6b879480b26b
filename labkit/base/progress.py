"""Progress on a long wait: a ``tqdm.auto`` bar where one can redraw, plain lines where not.

One rule for every wait over a few seconds (a run, a calibration, grading, Ray's start):

* in a Jupyter kernel or with stderr on a terminal (``interactive``): a ``tqdm.auto`` bar
  (a widget in a notebook, a redrawn line on a terminal), shown only once the wait has
  lasted ``delay`` seconds unless progress was asked for (``enabled=True``);
* elsewhere (a pipe, a log file): nothing, unless asked for, then one plain line per step;
* never on stdout: ``--json`` output and what tests parse stay clean.

``enabled`` follows ``RunConfig.progress``: ``None`` shows progress where one can see it,
``True`` always, ``False`` never.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any, TextIO, TypeVar

T = TypeVar("T")


def in_kernel() -> bool:
    """Whether this process is a running Jupyter kernel. Asked of IPython, not inferred from
    ``ipykernel`` being imported: a process that only imported it (a test worker that drove
    a notebook) is no kernel, and its progress must stay plain lines."""
    if "ipykernel" not in sys.modules or "IPython" not in sys.modules:
        return False
    shell = sys.modules["IPython"].get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def interactive() -> bool:
    """True in a running Jupyter kernel or when stderr is a terminal (where a bar can redraw)."""
    return in_kernel() or bool(getattr(sys.stderr, "isatty", lambda: False)())


def bar(total: int | None, enabled: bool | None, desc: str, unit: str = "step",
        delay: float = 2.0) -> Any:
    """A ``tqdm.auto`` bar on stderr, or None where none should show (see the module doc).
    ``delay``: seconds before it first shows when ``enabled`` is None."""
    if enabled is False or (enabled is None and not interactive()):
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, delay=0 if enabled else delay, leave=False,
                file=sys.stderr)


CLOCK_FORMAT = "{desc}: {elapsed}{postfix}"
"""A wait that counts no steps of its own shows its time so far (and steps, once known)."""


def clock(desc: str, enabled: bool | None, delay: float = 2.0) -> Any:
    """A bar that shows how long a wait has lasted, by the module's rule (None where none
    should show). ``ticking`` keeps its time moving; ``update(0)`` redraws it now (at most ten
    times a second); ``set_postfix_str`` adds what is known (the steps done)."""
    if enabled is False or (enabled is None and not interactive()):
        return None
    from tqdm.auto import tqdm

    return tqdm(total=None, desc=desc, delay=0 if enabled else delay, leave=False,
                file=sys.stderr, bar_format=CLOCK_FORMAT)


class Progress:
    """Steps of one wait (``total`` of them, or an unknown number), shown by the module's rule.

    ``step(what)`` counts one step done and names it; ``note(text)`` adds a line that stays
    (a retry, a phase); ``close()`` ends it. Every method is a no-op where nothing shows.
    """

    def __init__(self, desc: str, total: int | None = None, *, unit: str = "step",
                 enabled: bool | None = None, delay: float = 2.0):
        self.desc, self.total, self.done = desc, total, 0
        plain = bool(enabled) and not interactive()  # asked for, where no bar can redraw
        self._bar = None if plain else bar(total, enabled, desc, unit, delay)
        self._lines: TextIO | None = sys.stderr if plain else None
        self._shown = ExitStack()  # the bar shows on time and its clock moves between steps
        self._shown.enter_context(showing(self._bar))

    def step(self, what: str = "", n: int = 1) -> None:
        """``n`` more steps done; ``what`` names the last one."""
        self.done += n
        if self._bar is not None:
            if what:
                self._bar.set_postfix_str(what, refresh=False)
            self._bar.update(n)
        elif self._lines is not None:
            of = f"/{self.total}" if self.total else ""
            self._say(f"{self.desc}: {self.done}{of}" + (f" {what}" if what else ""))

    def note(self, text: str) -> None:
        """A line that stays above the bar (or a plain line)."""
        if self._bar is not None:
            self._bar.write(text, file=sys.stderr)
        elif self._lines is not None:
            self._say(text)

    def restart(self, desc: str, total: int | None = None) -> None:
        """Count again from zero (a second try), under a new description."""
        self.desc, self.done, self.total = desc, 0, total if total is not None else self.total
        if self._bar is not None:
            self._bar.reset(total=self.total)
            self._bar.set_description(desc)

    def close(self) -> None:
        self._shown.close()  # stops the ticker, closes the bar
        self._bar = self._lines = None

    def _say(self, line: str) -> None:
        assert self._lines is not None
        print(line, file=self._lines, flush=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


SWEEP_DELAY_S = 3.0
"""A sweep's bar shows once the sweep has lasted this long (where nobody asked for it):
well before the 5 s a wait may last in silence, with the ticker's half second to spare."""


def each(items: Sequence[T], desc: str, *, name: Callable[[T], str] = str, unit: str = "run",
         progress: bool | None = None) -> Iterator[T]:
    """``items`` one by one, with one bar over them all: a lesson's sweep (a run per world
    size, per method, per bucket size) counts its runs, each named by ``name(item)`` as it
    finishes. ``progress`` follows the module's rule, the bar waiting ``SWEEP_DELAY_S``."""
    with Progress(desc, total=len(items), unit=unit, enabled=progress,
                  delay=SWEEP_DELAY_S) as shown:
        for item in items:
            yield item
            shown.step(name(item))


@contextmanager
def every(seconds: float, call: Callable[[], None]) -> Iterator[None]:
    """Call ``call`` every ``seconds`` (from a daemon thread) while the block runs."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(seconds):
            call()

    thread = threading.Thread(target=loop, name="labkit-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=seconds + 1.0)


@contextmanager
def ticking(shown: Any, every_s: float = 0.5) -> Iterator[None]:
    """Redraw ``shown`` (a bar from ``bar`` or ``clock``, or None) from a thread while the
    block runs, once its ``delay`` has passed: its time keeps moving through the waits
    nobody counts (a fork server importing torch, ranks starting) and shows the bar on time.
    ipykernel sends a redraw from a thread to the running cell's output."""
    if shown is None:
        yield
        return
    started, after = time.monotonic(), float(getattr(shown, "delay", 0.0) or 0.0)

    def tick() -> None:
        if time.monotonic() - started >= after:
            shown.refresh()

    with every(every_s, tick):
        yield


@contextmanager
def showing(shown: Any) -> Iterator[None]:
    """``ticking(shown)`` for the block, then ``shown`` closed (None: nothing at all): one bar
    for one wait, gone when the wait is over, however it ends."""
    try:
        with ticking(shown):
            yield
    finally:
        if shown is not None:
            shown.close()


@contextmanager
def waiting(what: str, *, after_s: float = 2.0, enabled: bool | None = None,
            tick_s: float = 1.0) -> Iterator[None]:
    """Say ``what`` is happening if the block is still running after ``after_s`` seconds: a
    line with the elapsed time, redrawn every ``tick_s`` (a terminal), or one plain line
    (``enabled=True`` elsewhere); nothing for a block that ends sooner. In a notebook the
    bar shows at once (a widget is displayed from the cell's own thread) and goes at the end.
    """
    if enabled is False or (enabled is None and not interactive()):
        yield
        return
    started = time.monotonic()
    shown: list[Any] = [clock(what, True)] if in_kernel() else []
    said = [bool(shown)]

    def tick() -> None:
        if shown:
            shown[0].refresh()
        elif not said[0] and time.monotonic() - started >= after_s:
            said[0] = True
            if interactive():
                shown.append(clock(what, True))
            else:
                print(f"{what}...", file=sys.stderr, flush=True)

    try:
        with every(min(tick_s, max(after_s, 0.05)), tick):
            yield
    finally:
        for bar_ in shown:
            bar_.close()
