"""Type and range rules for user input, each returning a message that names the value,
the rule and a valid example (or None when the value is fine).

Teaches nothing about distributed training; it is what keeps a typo from starting eight
processes that then die with a bare ``TypeError``. Python's ``bool`` is an ``int``
(``True + 1 == 2``), so every integer rule rejects it explicitly; a float is never taken
for an integer (``2.0`` ranks is a bug upstream, not a request for 2), and a real number
must be finite (``inf`` seconds is no timeout, an ``inf`` learning rate is NaN weights).
Numpy scalars count as the Python number they hold. Torch-free.

Options dataclasses declare a rule per field (``option(default, integer(1, example=4))``)
and call ``check_fields(self)`` in ``__post_init__``; only rules across fields are written
by hand.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable
from typing import Any

MAX_LOCAL_WORLD_SIZE = 64
"""Most ranks ``labkit.run`` / ``labkit.launch`` start on one machine. Each rank is a full
Python process with torch loaded (about 0.23 GB before it trains), so 64 ranks already
hold about 15 GB, and gloo connects every pair (64 x 63 sockets). For more, use torchrun
across machines (``labkit.worker``)."""


def is_int(value: Any) -> bool:
    """An integer that is not a bool (numpy integers count)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """An int or float that is not a bool (numpy scalars count)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _example(name: str, example: Any) -> str:
    return f"; e.g. {name}={example!r}"


def int_problem(name: str, value: Any, lo: int, hi: int | None = None, *, example: Any,
                why: str = "") -> str | None:
    """``lo <= value <= hi`` for an integer ``value`` (``hi`` None: no upper bound)."""
    rule = f">= {lo}" if hi is None else f">= {lo} and <= {hi}"
    if not is_int(value):
        return (f"{name} ({value!r}) must be an integer {rule}, not {type(value).__name__}"
                f"{why}{_example(name, example)}")
    if value < lo or (hi is not None and value > hi):
        return f"{name} ({value}) must be {rule}{why}{_example(name, example)}"
    return None


def real_problem(name: str, value: Any, hi: float, *, unit: str = "", example: Any,
                 why: str = "") -> str | None:
    """``0 < value <= hi`` for a finite real ``value``."""
    rule = f"> 0 and <= {hi:g}{unit}"
    if not is_real(value):
        return (f"{name} ({value!r}) must be a number {rule}, not {type(value).__name__}"
                f"{why}{_example(name, example)}")
    if not math.isfinite(value):
        return f"{name} ({value}) must be a finite number {rule}{why}{_example(name, example)}"
    if not 0 < value <= hi:
        return f"{name} ({value}) must be {rule}{why}{_example(name, example)}"
    return None


def bool_problem(name: str, value: Any, *, optional: bool = False) -> str | None:
    """``value`` is True or False (or None when ``optional``)."""
    if isinstance(value, bool) or (optional and value is None):
        return None
    allowed = "True, False or None" if optional else "True or False"
    return f"{name} ({value!r}) must be {allowed}, not {type(value).__name__}"


def choice_problem(name: str, value: Any, choices: tuple[str, ...]) -> str | None:
    """``value`` is one of the strings in ``choices``."""
    if isinstance(value, str) and value in choices:
        return None
    return f"{name} {value!r} must be one of {', '.join(choices)}"


def local_world_size_problem(world_size: Any) -> str | None:
    """The rule for a run whose ranks all start on this machine (supervisor, launch)."""
    return int_problem("world_size", world_size, 1, MAX_LOCAL_WORLD_SIZE, example=2,
                       why=" ranks on one machine (each is a Python process with torch, about "
                           "0.23 GB; for more use torchrun across machines)")


def as_plain(value: Any) -> Any:
    """A numpy scalar as the Python int / float it holds (JSON and pickles stay plain)."""
    if is_int(value) and type(value) is not int:
        return int(value)
    if is_real(value) and not isinstance(value, (int, float)):
        return float(value)
    return value


# ---- declared rules: one per field of an options dataclass ---------------------------------

Rule = Callable[[str, Any], "str | None"]
"""``rule(name, value)`` -> the message naming the value, the rule and an example, or None."""


def integer(lo: int, hi: int | None = None, *, example: Any, why: str = "",
            optional: bool = False) -> Rule:
    """An integer in ``lo..hi`` (``optional``: None allowed too)."""
    def rule(name: str, value: Any) -> str | None:
        if optional and value is None:
            return None
        return int_problem(name, value, lo, hi, example=example, why=why)
    return rule


def real(lo: float = 0.0, hi: float = math.inf, *, example: Any, lo_open: bool = True,
         unit: str = "", why: str = "") -> Rule:
    """A finite real number above ``lo`` (or equal, with ``lo_open=False``) and <= ``hi``."""
    low = f"> {lo:g}" if lo_open else f">= {lo:g}"
    rule_text = low + ("" if hi == math.inf else f" and <= {hi:g}") + unit

    def rule(name: str, value: Any) -> str | None:
        if not is_real(value):
            return (f"{name} ({value!r}) must be a number {rule_text}, not "
                    f"{type(value).__name__}{why}{_example(name, example)}")
        if not math.isfinite(value):
            return f"{name} ({value}) must be a finite number {rule_text}{why}{_example(name, example)}"
        if value < lo or (lo_open and value == lo) or value > hi:
            return f"{name} ({value}) must be {rule_text}{why}{_example(name, example)}"
        return None
    return rule


def one_of(choices: tuple[Any, ...], *, example: Any, why: str = "") -> Rule:
    """One of ``choices`` (strings or numbers; a bool is never a number here)."""
    def rule(name: str, value: Any) -> str | None:
        if not isinstance(value, bool) and value in choices and \
                type(value) in {type(c) for c in choices}:
            return None
        listed = ", ".join(str(c) for c in choices)
        return f"{name} ({value!r}) must be one of {listed}{why}{_example(name, example)}"
    return rule


def integers(lo: int, *, example: Any, why: str = "") -> Rule:
    """A sequence of integers, each >= ``lo``."""
    def rule(name: str, value: Any) -> str | None:
        items = list(value) if isinstance(value, (list, tuple)) else None
        if items is None or not all(is_int(v) and v >= lo for v in items):
            return (f"{name} ({value!r}) must be a list of integers >= {lo}{why}"
                    f"{_example(name, example)}")
        return None
    return rule


def flag() -> Rule:
    """True or False."""
    return bool_problem


def option(default: Any, rule: Rule) -> Any:
    """A dataclass field with its default and its rule (``check_fields`` applies it)."""
    return dataclasses.field(default=default, metadata={"rule": rule})


def check_fields(obj: Any) -> list[str]:
    """Every declared rule of ``obj``'s fields that its values break (numpy scalars count
    as the numbers they hold)."""
    problems = []
    for f in dataclasses.fields(obj):
        rule = f.metadata.get("rule")
        if rule is None:
            continue
        value = as_plain(getattr(obj, f.name))
        object.__setattr__(obj, f.name, value)
        problem = rule(f.name, value)
        if problem is not None:
            problems.append(problem)
    return problems


COMM_WAIT_ENV = "LABKIT_COMM_WAIT"
"""How ranks wait for their all-reduces: ``sleep`` (the default) or ``spin``
(``labkit.trace.comm.spin_waits``)."""
COMM_WAITS = ("sleep", "spin")


def comm_wait_problem(value: str | None = None) -> str | None:
    """The rule ``LABKIT_COMM_WAIT`` (``value``, else the environment's) breaks, if any:
    checked before any rank starts, read again by each rank."""
    import os

    wanted = os.environ.get(COMM_WAIT_ENV, "sleep") if value is None else value
    if wanted in COMM_WAITS:
        return None
    return (f"{COMM_WAIT_ENV}={wanted!r} must be 'sleep' or 'spin' (how ranks wait for their "
            f"all-reduces); e.g. unset it, or export {COMM_WAIT_ENV}=spin")
