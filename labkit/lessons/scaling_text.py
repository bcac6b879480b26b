"""The sentences lesson 02 prints under its LR table, computed from the runs it just made.

The table compares runs that saw the same number of samples: one rank, then N ranks with the
LR unscaled, linearly scaled, scaled with warmup, and far too large without and with
clipping (Goyal et al. 2017). Which of them lags, lands close, or blows up is a fact of
*this* run (seeded, so it repeats on this machine, but another CPU's kernels round
differently), so every sentence here reads the final losses of the table above it -- the
mean over the last eighth of each run, the same column the table prints. Nothing here is
timed, so no noise band: a final loss "lands close" when it is within ``CLOSE`` of the
reference's. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Protocol

CLOSE = 0.15
"""Relative gap in final loss within which two runs 'land close' (15 %)."""


class Curve(Protocol):
    """What the sentences read of one run (``labkit.lessons.scaling.CurveRun``)."""

    name: str
    lr: float
    losses: list[float]

    def final_loss(self, window: float = 0.125) -> float: ...

    @property
    def diverged(self) -> bool: ...


def _find(runs: Mapping[str, Curve], words: str, *, without: str | None = None) -> Curve | None:
    for name, run in runs.items():
        if words in name and (without is None or without not in name):
            return run
    return None


def _versus(run: Curve, ref: Curve) -> str:
    """'lags behind' / 'lands close to' / 'ends below' the reference, with both numbers."""
    a, b = run.final_loss(), ref.final_loss()
    if not math.isfinite(a):
        return f"did not finish with a finite loss (the reference ended at {b:.3f})"
    gap = (a - b) / abs(b) if b else math.inf
    if abs(gap) <= CLOSE:
        verdict = "lands close to"
    elif gap > 0:
        verdict = "lags behind"
    else:
        verdict = "ends below"
    return f"{verdict} {ref.name!r}: final loss {a:.3f} against {b:.3f} ({gap:+.0%})"


def _blowup(run: Curve) -> str:
    finite = [v for v in run.losses if math.isfinite(v)]
    if len(finite) < len(run.losses):
        step = len(finite)
        return f"blew up: its loss was not a number from step {step} on (LR {run.lr:g})"
    if run.diverged:
        return (f"blew up: its loss rose to {max(finite):.3g}, more than 10x its first "
                f"{run.losses[0]:.3g} (LR {run.lr:g})")
    return f"stayed finite at LR {run.lr:g}: final loss {run.final_loss():.3f}"


def reading(runs: Mapping[str, Curve]) -> str:
    """One line per comparison the lesson draws, each read off the table's final losses."""
    single = _find(runs, "1 rank")
    unscaled = _find(runs, "LR unscaled")
    linear = _find(runs, "linear scaling")
    warm = _find(runs, "warmup")
    big = _find(runs, "too large")
    clipped = _find(runs, "clipping")
    lines: list[str] = []
    if single is not None:
        for run in (unscaled, linear, warm):
            if run is not None:
                lines.append(f"- {run.name!r} {_versus(run, single)}.")
    if big is not None:
        lines.append(f"- {big.name!r} {_blowup(big)}.")
    if clipped is not None:
        line = f"- {clipped.name!r} {_blowup(clipped)}"
        if single is not None and not clipped.diverged:
            line += f"; it {_versus(clipped, single).split(':')[0]}"
        lines.append(line + ".")
    if warm is not None and linear is not None:
        a, b = warm.final_loss(), linear.final_loss()
        if math.isfinite(a) and math.isfinite(b):
            word = "costs" if a > b else "saves"
            lines.append(f"- Warmup {word} {abs(a - b):.3f} in final loss here "
                         f"({a:.3f} with it, {b:.3f} without).")
    return "\n".join(lines)
