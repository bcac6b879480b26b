"""How the grader holds a student's function and what it raised: proxies and plain errors.

A :class:`RemoteFunction` stands, in the grader's namespace, for a function that lives in
the box (:class:`~labkit.grading.sandbox.remote.Session`): calling it sends plain
arguments in and brings plain data back. An exception inside the box crosses only as its
type name and message (:class:`StudentError`); a ``KeyboardInterrupt`` (the soft time
limit) becomes :class:`CellTimeout`; an ``AbsentInGrading`` (:mod:`absent`) names the
forbidden module the function reached for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from labkit.base.errors import LabError


class Session(Protocol):
    """What a proxy needs of the grader's session (``remote.Session`` is one)."""

    def call(self, name: str, args: Sequence[Any], kwargs: Mapping[str, Any],
             forbid: Sequence[str] = ()) -> tuple[Any, dict[str, Any]]: ...

    def launch(self, check: str, name: str, world_size: int, rank_args: Sequence[Any],
               forbid: Sequence[str] = ()) -> dict[str, Any]: ...


class CellTimeout(LabError):
    """Student code ran past a limit; the box was restarted."""


class StudentError(Exception):
    """The student's function raised; ``ename`` is the exception's type name in the box."""

    def __init__(self, ename: str, evalue: str):
        self.ename, self.evalue = ename, evalue
        super().__init__(f"{ename}: {evalue}" if evalue else ename)


def raise_student(error: Mapping[str, Any]) -> None:
    ename, evalue = str(error.get("ename", "Error")), str(error.get("evalue", ""))
    if ename == "KeyboardInterrupt":
        raise CellTimeout(f"stopped: it ran past the time limit ({evalue})")
    if ename == "NotImplementedError":
        raise NotImplementedError(evalue)
    raise StudentError(ename, evalue)


def absent_used(error: Mapping[str, Any], absent: Sequence[str]) -> str | None:
    """The forbidden name a failed call reached for, if its error says so."""
    ename, evalue = str(error.get("ename", "")), str(error.get("evalue", ""))
    if ename == "AbsentInGrading":
        return evalue.split(" ", 1)[0]
    if ename in ("ModuleNotFoundError", "ImportError"):
        return next((m for m in absent if m in evalue), None)
    return None


class RemoteFunction:
    """A student's function that lives in the box; calling it crosses as plain data."""

    def __init__(self, session: Session, name: str):
        self._session, self.__name__ = session, name

    @property
    def name(self) -> str:
        return self.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._session.call(self.name, args, kwargs)[0]

    def call_watched(self, args: Sequence[Any], kwargs: Mapping[str, Any],
                     forbid: Sequence[str]) -> tuple[Any, dict[str, Any]]:
        return self._session.call(self.name, args, kwargs, forbid)

    def launch(self, check: str, world_size: int, rank_args: Sequence[Any],
               forbid: Sequence[str] = ()) -> dict[str, Any]:
        return self._session.launch(check, self.name, world_size, rank_args, forbid)

    def __repr__(self) -> str:
        return f"<student function {self.name} (in the box)>"
