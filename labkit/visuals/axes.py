"""Axes a student reads at a glance: the small rules every lesson figure follows.

* **log axes** carry plain ticks at 1, 2 and 5 per decade, written as the quantity is spoken
  (``500 µs``, ``2 ms``; ``64 KB``, ``4 MB``; ``0.5x``, ``10x``), never ``6x10^0``;
* **counts and ranks** get integer ticks only (``integer_ticks``); a rank axis names each rank
  by its grid coordinates where the run has a grid (``rank_ticks``);
* a label drawn above a bar stays inside the axes (``headroom``).

Each helper takes a matplotlib ``Axes`` and changes only its ticks or limits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes

_SI = ((1e9, "G"), (1e6, "M"), (1e3, "K"), (1.0, ""))


def _plain(v: float) -> str:
    """A number without trailing zeros: 0.5, 2, 25, 1000."""
    return f"{v:.3g}" if v < 1000 else f"{v:,.0f}".replace(",", "")


def fmt_bytes(v: float) -> str:
    """Decimal bytes as spoken: 500 B, 64 KB, 4 MB, 1 GB."""
    for size, prefix in _SI:
        if v >= size:
            return f"{_plain(v / size)} {prefix}B"
    return f"{_plain(v)} B"


def fmt_seconds(v: float) -> str:
    """Seconds as spoken: 50 µs, 2 ms, 1.5 s."""
    for size, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if v >= size:
            return f"{_plain(v / size)} {unit}"
    return f"{_plain(v * 1e9)} ns"


def fmt_times(v: float) -> str:
    """A multiplier: 0.5x, 1x, 10x."""
    return f"{_plain(v)}x"


FORMATS: dict[str, Callable[[float], str]] = {
    "bytes": fmt_bytes, "seconds": fmt_seconds, "times": fmt_times, "plain": _plain,
    "ms": lambda v: f"{_plain(v)} ms"}


def log_ticks(ax: Axes, axis: str = "y", unit: str = "plain") -> None:
    """Put ``axis`` on a log scale with ticks at 1, 2, 5 x 10^k, labelled plainly in ``unit``
    (a key of ``FORMATS``); minor ticks stay unlabelled."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    fmt = FORMATS[unit]
    a = ax.yaxis if axis == "y" else ax.xaxis
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    lo, hi = (ax.get_ylim() if axis == "y" else ax.get_xlim())
    lo, hi = max(lo, 1e-30), max(hi, 1e-30)
    ticks = [m * 10.0 ** k for k in range(math.floor(math.log10(lo)) - 1,
                                          math.ceil(math.log10(hi)) + 1) for m in (1, 2, 5)]
    shown = [t for t in ticks if lo <= t <= hi]
    if len(shown) > 7:  # a wide range: decades only, or the labels collide
        shown = [t for t in shown if f"{t:.0e}".startswith("1")]
    a.set_major_locator(FixedLocator(shown))
    a.set_major_formatter(FuncFormatter(lambda v, _pos: fmt(v)))
    a.set_minor_formatter(NullFormatter())


def integer_ticks(ax: Axes, axis: str = "x") -> None:
    """Whole numbers only on ``axis`` (counts, steps, ranks)."""
    from matplotlib.ticker import MaxNLocator

    (ax.yaxis if axis == "y" else ax.xaxis).set_major_locator(MaxNLocator(integer=True))


def rank_ticks(ax: Axes, ranks: Sequence[int], labels: Sequence[str] | None = None,
               axis: str = "x") -> None:
    """One tick per rank, at the rank's position, named by ``labels`` (e.g. the rank's grid
    coordinates) or ``rank N``."""
    names = list(labels) if labels is not None else [f"rank {r}" for r in ranks]
    if axis == "x":
        ax.set_xticks(list(ranks), names)
    else:
        ax.set_yticks(list(ranks), names)


def headroom(ax: Axes, share: float = 0.15) -> None:
    """Raise the top of a linear y axis by ``share`` of its span, so labels over the
    tallest bar stay inside the axes."""
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi + share * (hi - lo))
