"""Reading a student's answer: numbers in the forms people write them, and the tolerance.

Numeric tolerance: an answer is correct when it is within ``REL_TOL`` (1%) of the key,
relative to the key; questions whose key is a whole number (a batch size, bytes per
parameter) need the exact value. Three significant figures always pass. Answers may be
written ``0.004``, ``4e-3``, ``1/250``, ``0.4%``, ``1,024``, ``0,004`` (decimal comma) or
with the unit the question names (``"12 GB"``, ``"6x"``); a choice as a letter or the
choice's text. What cannot be read raises
:class:`AnswerFormatError` with a message that shows the valid forms.
"""

from __future__ import annotations

import math
import re

REL_TOL = 0.01
"""Relative tolerance for numeric answers: |given - key| <= 1% of |key|."""

LETTERS = "ABCDEFGH"
"""Choice labels, in display order."""

_THOUSANDS = re.compile(r"^[+-]?[1-9]\d{0,2}(,\d{3})+(\.\d*)?$")
_LETTER = re.compile(r"^\(?([a-h])\)?[.:)]?$")
_LETTER_AND_TEXT = re.compile(r"^\(?([a-h])[.:)]\s*(.+)$")


class AnswerFormatError(ValueError):
    """An answer could not be read; the message tells the student how to write it."""


def parse_number(text: object, unit: str = "") -> float:
    """Read a numeric answer (``"0.004"``, ``"4e-3"``, ``"1/250"``, ``"25%"``, ``"1,024"``).

    Raises AnswerFormatError with a message that shows valid forms.
    """
    if isinstance(text, bool):
        raise AnswerFormatError(f"{text!r} is not a number; write e.g. 0.004 or 4e-3")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        s = str(text).strip().lower().replace("×", "x").replace(" ", "")
        if not s:
            raise AnswerFormatError("no answer given")
        u = unit.strip().lower().replace(" ", "")
        if u and s.endswith(u) and len(s) > len(u):
            s = s[: -len(u)]
        scale = 1.0
        if s.endswith("%"):
            s, scale = s[:-1], 0.01
        if _THOUSANDS.match(s):
            s = s.replace(",", "")
        elif s.count(",") == 1 and "." not in s:
            s = s.replace(",", ".")  # a decimal comma: 0,004
        try:
            if s.count("/") == 1:
                num, den = (float(p) for p in s.split("/"))
                if den == 0:
                    raise AnswerFormatError(f"{text!r} divides by zero")
                value = num / den * scale
            else:
                value = float(s) * scale
        except ValueError:
            raise AnswerFormatError(
                f"could not read {str(text)!r} as a number; write it like 0.004, 4e-3 or 1/250"
            ) from None
    if not math.isfinite(value):
        raise AnswerFormatError(f"{text!r} is not a finite number")
    return value


def numbers_match(given: float, expected: float, *, integer: bool = False) -> bool:
    """True when ``given`` is the key: exact for whole-number keys, else within REL_TOL."""
    if integer:
        return abs(given - expected) < 1e-9
    return math.isclose(given, expected, rel_tol=REL_TOL, abs_tol=1e-12)


def parse_choice(given: str, choices: tuple[str, ...]) -> int:
    """Index of the choice a student meant: a letter (``b``, ``(B)``, ``B)``), the choice's
    text (case and spacing ignored), or both (``B) all-gather``).

    Raises AnswerFormatError naming the valid letters.
    """
    norm = " ".join(given.lower().split())
    texts = [" ".join(c.lower().split()) for c in choices]
    if norm in texts:
        return texts.index(norm)
    letters = LETTERS[: len(choices)].lower()
    m = _LETTER.match(norm)
    if m and m.group(1) in letters:
        return letters.index(m.group(1))
    m = _LETTER_AND_TEXT.match(norm)
    if m and m.group(1) in letters and texts[letters.index(m.group(1))] == m.group(2):
        return letters.index(m.group(1))
    valid = ", ".join(letters.upper())
    raise AnswerFormatError(f"{given!r} is not one of the choices; answer with a letter "
                            f"({valid}) or the choice's text")
