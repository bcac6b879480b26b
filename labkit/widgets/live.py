"""What every live widget shares: warm ranks to run on, and slider events debounced.

A widget that reruns a real job when a control moves must not start ranks per event: it
runs on the kernel's warm pool (``labkit.pool``), where a small job takes a fraction of a
second. Dragging a slider fires an event per position, so runs are *debounced*: each event
(re)arms a short timer on the kernel's event loop, and only the last one runs, once the
hand is still. Without a running event loop (a plain script, a test) the run happens at once.

A debounced run happens outside the message that moved the slider, where an
``ipywidgets.Output`` can no longer capture a display (the front end has closed that
message), so its figure is shown by value: ``FigureView`` sends the PNG as widget state.
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Callable
from typing import Any

from labkit.base.errors import LabError

DEBOUNCE_S = 0.3
"""How long the controls must rest before a run starts."""


class Debouncer:
    """Calls ``fn()`` ``delay_s`` after the LAST ``trigger()`` (on the kernel's event loop)."""

    def __init__(self, fn: Callable[[], None], delay_s: float = DEBOUNCE_S):
        self.fn, self.delay_s = fn, delay_s
        self._handle: asyncio.TimerHandle | None = None

    def trigger(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no kernel loop here: run now
            self.fn()
            return
        self._handle = loop.call_later(self.delay_s, self._fire)

    def _fire(self) -> None:
        self._handle = None
        self.fn()

    @property
    def pending(self) -> bool:
        return self._handle is not None


def warm_runner(runner: Any, world_size: int) -> Any:
    """``runner`` if given (anything with ``.run(**kwargs)``), else the kernel's pool."""
    if runner is not None:
        return runner
    from labkit.launchers.pool import pool

    return pool(world_size)


def timed_run(runner: Any, **run_kwargs: Any) -> tuple[Any, float, str | None]:
    """(result, seconds, error message): a failed run is shown, never raised in a callback."""
    t0 = time.monotonic()
    try:
        return runner.run(**run_kwargs), time.monotonic() - t0, None
    except LabError as err:
        return None, time.monotonic() - t0, f"{type(err).__name__}: {err}"


class FigureView:
    """A matplotlib figure shown as an ``ipywidgets.Image``: ``show(fig)`` works from any
    callback and swaps the picture in place (no flicker of a cleared output).

    Before its first figure (and after ``clear``) the view shows ``placeholder`` text, never
    an empty image, which a browser draws as a broken-image icon."""

    def __init__(self, placeholder: str = "The figure appears here after the first run.") -> None:
        import ipywidgets as w

        self.image = w.Image(format="png", layout=w.Layout(max_width="100%", height="auto",
                                                          align_self="flex-start"))
        self.placeholder = w.HTML(f"<div style='color:#777;font-style:italic;padding:6px 0'>"
                                  f"{placeholder}</div>")
        self.widget = w.Box([self.placeholder])
        self.figure: Any = None

    def show(self, fig: Any) -> None:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=fig.dpi, bbox_inches="tight")  # as inline figures
        png = buf.getvalue()
        self.figure = fig
        self.image.width = str(int.from_bytes(png[16:20], "big"))  # its own size, not stretched
        self.image.value = png
        self.widget.children = (self.image,)

    def clear(self) -> None:
        self.figure = None
        self.image.value = b""
        self.widget.children = (self.placeholder,)
