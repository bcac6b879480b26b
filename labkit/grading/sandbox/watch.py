"""Inside the box: what a student's function called while the grader watched it.

:class:`CallWatch` records every call into a forbidden labkit module (for problem set 1
``labkit.theory``, the same calculators the answer key uses; for the 1F1B exercise
``labkit.schedules``, which already builds that plan). It hooks ``sys.setprofile`` (and
``threading.setprofile``) so an indirect call (``getattr(__import__("labkit"), ...)``) is
seen too; if the student's code removes the hook, ``tampered`` says so.

It lives in the student's process, so whoever owns that interpreter can switch it off
(replace ``CallWatch._profile``, say). It is feedback for practice runs in the student's
own kernel. Grading does not rely on it: a part that forbids a module runs in a box where
that module is absent (:mod:`absent`), and communication exercises run each rank in its
own box with the grader relaying every message (:mod:`relay`).
"""

from __future__ import annotations

import sys
import threading
from types import FrameType
from typing import Any


class CallWatch:
    """Records calls into modules whose names start with one of ``forbidden``."""

    def __init__(self, forbidden: tuple[str, ...] | list[str]):
        self.forbidden = tuple(forbidden)
        self.used: list[str] = []
        self.tampered = False
        self._previous: Any = None
        self._hook = self._profile  # one bound method, so the check below can use `is`

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if isinstance(module, str) and module.startswith(self.forbidden) \
                and module != __name__:  # the watch's own __exit__ is not the student's call
            name = f"{module}.{frame.f_code.co_name}"
            if name not in self.used:
                self.used.append(name)

    def __enter__(self) -> CallWatch:
        if self.forbidden:
            self._previous = sys.getprofile()
            sys.setprofile(self._hook)
            threading.setprofile(self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.forbidden:
            return
        if sys.getprofile() is not self._hook:
            self.tampered = True
        sys.setprofile(self._previous)
        threading.setprofile(None)  # type: ignore[arg-type]

    def report(self) -> dict[str, Any]:
        return {"used": list(self.used), "tampered": self.tampered}
