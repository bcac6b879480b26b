"""Check helpers for graded exercises: turn a student's answer into plain data, then compare.

Grading safety rule (nbgrader's own advice, made strict): never compare a student's object
with ``==``. An object whose ``__eq__`` always returns True would pass ``answer == 1024``.
So every check first converts the answer to a plain Python ``float`` / ``int`` or a plain
``torch.Tensor`` (``as_number``, ``as_tensor``), rejecting anything else, and only then
compares, with explicit tolerances, using code the student did not write.

A check returns a :class:`Verdict`: ``passed``, and ``feedback`` that says what was wrong
*and what to try*. In an nbgrader test cell call ``verdict.require()`` (or ``require(...)``):
it prints the feedback on success and raises ``AssertionError(feedback)`` on failure, which
is what nbgrader records and what the feedback HTML shows.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


class NotANumber(TypeError):
    """The answer could not be turned into a plain number."""


@dataclass
class Verdict:
    """The outcome of one check: passed or not, and feedback that says what to try."""

    passed: bool
    feedback: str
    details: dict[str, Any] = field(default_factory=dict)

    def require(self) -> Verdict:
        """Print the feedback if passed; else raise AssertionError carrying the feedback."""
        if not self.passed:
            raise AssertionError(self.feedback)
        print(self.feedback)
        return self

    def __bool__(self) -> bool:
        return self.passed


def require(verdict: Verdict) -> Verdict:
    """``verdict.require()`` as a function, for test cells that read better that way."""
    return verdict.require()


def combine(verdicts: Iterable[Verdict], ok_message: str) -> Verdict:
    """One verdict from many: passed when all passed; feedback lists every failure."""
    items = list(verdicts)
    failed = [v for v in items if not v.passed]
    if not failed:
        return Verdict(True, ok_message)
    return Verdict(False, "\n".join(v.feedback for v in failed))


# --- converting answers to plain data ------------------------------------------------------

def as_number(value: object, name: str = "answer") -> float:
    """``value`` as a plain float; raise NotANumber for anything that is not a real number.

    Accepted: int, float, numpy scalars, 0-d or one-element torch/numpy arrays. Rejected:
    bool, str, None, and any other object (even one whose ``__eq__`` says yes to everything).
    """
    if isinstance(value, bool) or value is None or isinstance(value, (str, bytes)):
        raise NotANumber(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    v: Any = value
    if hasattr(v, "numel") and hasattr(v, "item"):  # torch tensor
        if v.numel() != 1:
            raise NotANumber(f"{name} must be one number, got a tensor of shape "
                             f"{tuple(v.shape)}")
        v = v.item()
    elif type(v).__module__ == "numpy" and hasattr(v, "size") and hasattr(v, "item"):
        if v.size != 1:
            raise NotANumber(f"{name} must be one number, got an array of shape {v.shape}")
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise NotANumber(f"{name} must be a number (int or float), got {type(v).__name__}")
    number = float(v)
    if type(number) is not float:  # a __float__ that returns a float subclass
        number = float.__new__(float, number)
    return number


def as_tensor(value: object, name: str = "result") -> Any:
    """``value`` as a plain, detached ``torch.Tensor`` copy (subclasses are stripped)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().as_subclass(torch.Tensor).clone()
    raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")


# --- comparing --------------------------------------------------------------------------------

def close(a: float, b: float, rel: float = 1e-6, abs_tol: float = 1e-12) -> bool:
    """Plain-float comparison (both already converted by ``as_number``)."""
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_tol)


def check_number(name: str, answer: object, expected: float, *, rel: float = 1e-6,
                 hint: str = "", unit: str = "", show_expected: bool = False) -> Verdict:
    """Compare one numeric answer with the key (computed by ``labkit.theory``).

    ``hint`` says what to try when the answer is wrong; ``show_expected`` reveals the key in
    the feedback (only for worked examples whose numbers the student was given).
    """
    try:
        got = as_number(answer, name)
    except NotANumber as exc:
        return Verdict(False, f"{name}: {exc}. Return a plain int or float.")
    if close(got, float(expected), rel):
        return Verdict(True, f"{name}: {got:g}{unit} is right.", {"got": got})
    msg = f"{name}: got {got:g}{unit}"
    if show_expected:
        msg += f", expected {float(expected):g}{unit}"
    msg += "." + (f" Try: {hint}" if hint else "")
    return Verdict(False, msg, {"got": got, "expected": float(expected)})


def check_function(name: str, fn: Callable[..., Any], cases: Iterable[tuple[dict[str, Any],
                   float]], *, rel: float = 1e-6, hint: str = "", reveal: bool = True
                   ) -> Verdict:
    """Call the student's ``fn(**kwargs)`` on each case and compare with the expected value.

    The first failing case is reported with its inputs (``reveal=False`` hides the expected
    value, for randomised hidden cases). An exception inside ``fn`` fails the check.
    """
    count = 0
    for kwargs, expected in cases:
        count += 1
        call = f"{name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
        try:
            answer = fn(**kwargs)
        except NotImplementedError:
            return Verdict(False, f"{name} is not implemented yet: replace "
                           "`raise NotImplementedError` with your code.")
        except Exception as exc:  # noqa: BLE001 (the student's code raised: report it)
            return Verdict(False, f"{call} raised {type(exc).__name__}: {exc}. "
                           + (f"Try: {hint}" if hint else ""))
        verdict = check_number(call, answer, expected, rel=rel, hint=hint, show_expected=reveal)
        if not verdict.passed:
            return verdict
    return Verdict(True, f"{name}: all {count} case(s) right.", {"cases": count})
