"""What each lesson's own run must show, checked in the lesson's kernel after its last cell.

``tests/notebooks/test_notebooks.py`` executes a lesson, then runs ``check(NAME, globals())``
in the same kernel: the checks read the very objects the cells printed and plotted, so they
pin what the student saw. They assert the *phenomenon* each lesson teaches, with a margin
(a ratio, an order, a split), never a time. A check fails with the measured numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def lesson_11(ns: dict[str, Any]) -> None:
    """With a straggler, ASP handles at least 1.5x BSP's gradients per second while every
    worker computes (predicted 2.5), reaches the target loss first, and the printed race says
    so; BSP stays synchronous SGD and SSP within its bound."""
    ps, exp = ns["ps"], ns["exp"]
    rows = {r["quantity"]: r for r in ps.straggler_predictions(exp)}
    ratio = rows["ASP / BSP gradients per second"]["measured"]
    assert ratio >= 1.5, f"ASP / BSP gradients per second {ratio:.2f} < 1.5 (predicted 2.5)"
    table = {r["run"]: r for r in exp.table()}
    asp, bsp = (table[f"{c}, straggler"]["time_to_target_s"] for c in ("asp", "bsp"))
    assert asp is not None and (bsp is None or asp < bsp), f"ASP {asp} s, BSP {bsp} s"
    assert "the rule holds here" in ps.race_text(exp), ps.race_text(exp)
    assert all(table[n]["max_staleness"] == 0 for n in table if n.startswith("bsp"))
    assert all(table[n]["max_staleness"] <= exp.settings["bound"] for n in table
               if n.startswith("ssp"))


CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "11_async_training": lesson_11,
}


def check(stem: str, ns: dict[str, Any]) -> str:
    """Run the lesson's check, if it has one; returns what was checked (for the output)."""
    fn = CHECKS.get(stem)
    if fn is None:
        return f"{stem}: no claims to check"
    fn(ns)
    return f"{stem}: {fn.__doc__.split(chr(10))[0] if fn.__doc__ else 'checked'}"
