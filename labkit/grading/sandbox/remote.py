"""The grader's side of a graded notebook: the box, time limits, and proxies.

A :class:`Session` owns one box for one notebook. Every student cell runs in it under the
per-cell limit; a cell that does not come back is stopped (SIGINT inside, then the whole
box killed from outside), a fresh box starts and the cells that did finish are replayed in
order, so the rest of the notebook is still graded. A test cell in the grader gets, for
each student name it uses, either the plain value (:mod:`wire`) or a
:class:`RemoteFunction`: calling it sends the arguments into the box and returns what the
student's function returned, as plain data. The test cell as a whole has the same limit.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from labkit.base.errors import LabError
from labkit.grading.sandbox.box import Box, BoxError, BoxTimeout
from labkit.grading.sandbox.wire import decode, encode

GRACE_S = 3.0  # after the soft limit (SIGINT in the box), how long before the box is killed
BOX_START_S = 60.0


class CellTimeout(LabError):
    """Student code ran past the time limit; the box was restarted."""


class StudentError(Exception):
    """The student's function raised; ``ename`` is the exception's type name in the box."""

    def __init__(self, ename: str, evalue: str):
        self.ename, self.evalue = ename, evalue
        super().__init__(f"{ename}: {evalue}" if evalue else ename)


def _raise_student(error: Mapping[str, Any]) -> None:
    ename, evalue = str(error.get("ename", "Error")), str(error.get("evalue", ""))
    if ename == "KeyboardInterrupt":
        raise CellTimeout(f"stopped: it ran past the time limit ({evalue})")
    if ename == "NotImplementedError":
        raise NotImplementedError(evalue)
    raise StudentError(ename, evalue)


class Session:
    """One box for one notebook, with the replay log that rebuilds it after a hang."""

    def __init__(self, *, mode: str | None = None, course_root: Path | None = None,
                 files: Mapping[str, bytes] | None = None, cell_timeout: float = 60.0):
        self.mode, self.course_root, self.files = mode, course_root, dict(files or {})
        self.cell_timeout = float(cell_timeout)
        self.replay: list[str] = []
        self.restarts = 0
        self.deadline: float | None = None
        self.exhausted = False
        self.box: Box | None = None

    # ---- life cycle ---------------------------------------------------------------------
    def start(self) -> Session:
        self.box = Box(mode=self.mode, course_root=self.course_root, files=self.files)
        self.box.start(BOX_START_S)
        return self

    def close(self) -> None:
        if self.box is not None:
            self.box.stop()
            self.box = None

    def _restart(self) -> None:
        """A fresh box with the finished cells run again (each under the same limit)."""
        self.close()
        self.restarts += 1
        self.start()
        kept = []
        for source in self.replay:
            try:
                reply = self._box().request("run", self.cell_timeout + GRACE_S, source=source,
                                            limit=self.cell_timeout)
            except BoxError:
                self.close()
                self.start()
                continue
            if reply.get("error", {}).get("ename") != "KeyboardInterrupt":
                kept.append(source)
        self.replay = kept

    def _box(self) -> Box:
        if self.box is None or not self.box.alive():
            raise BoxError("the box is not running")
        return self.box

    @property
    def mode_used(self) -> str:
        return self.box.mode if self.box is not None else str(self.mode)

    # ---- student cells --------------------------------------------------------------------
    def run_cell(self, source: str) -> dict[str, Any]:
        """Run one student cell; a timeout or crash becomes an error reply, never an exception."""
        limit = self.cell_timeout
        try:
            reply = self._box().request("run", limit + GRACE_S, source=source, limit=limit)
        except BoxTimeout:
            self._restart()
            return _stopped(limit, "and did not stop when interrupted; the box was restarted")
        except BoxError as exc:
            self._restart()
            return {"error": {"ename": "SandboxError", "evalue": f"{exc}", "traceback": ""}}
        if reply.get("error", {}).get("ename") == "KeyboardInterrupt":
            return {**_stopped(limit, "and was interrupted"), "stdout": reply.get("stdout", "")}
        self.replay.append(source)
        return reply

    # ---- what test cells use ----------------------------------------------------------------
    def begin_test(self, seconds: float) -> None:
        """A test cell starts: its calls into the box share ``seconds`` in all."""
        self.deadline = time.monotonic() + seconds
        self.exhausted = False

    def end_test(self) -> None:
        self.deadline, self.exhausted = None, False

    def remaining(self) -> float:
        if self.deadline is None:
            return self.cell_timeout
        return max(1.0, self.deadline - time.monotonic())

    def _request(self, op: str, **payload: Any) -> dict[str, Any]:
        if self.exhausted:  # one timeout per test cell: the rest of its calls fail at once
            raise CellTimeout("not run: an earlier call in this test ran out of time")
        limit = self.remaining()
        try:
            reply = self._box().request(op, limit + GRACE_S, limit=limit, **payload)
        except BoxTimeout:
            self._restart()
            self.exhausted = self.deadline is not None
            raise CellTimeout(f"stopped after {limit:.0f} s: it did not return in time "
                              "(an endless loop, or a recv without a send?)") from None
        except BoxError as exc:
            self._restart()
            raise CellTimeout(f"the student's process died: {exc}") from None
        if not reply.get("ok", False):
            _raise_student(reply.get("error", {}))
        if reply.get("error", {}).get("ename") == "KeyboardInterrupt":
            self.exhausted = self.deadline is not None
        return reply

    def describe(self, name: str) -> tuple[str, Any]:
        reply = self._request("describe", name=name)
        return reply.get("kind", "missing"), decode(reply.get("value"))

    def call(self, name: str, args: Sequence[Any], kwargs: Mapping[str, Any],
             forbid: Sequence[str] = ()) -> tuple[Any, dict[str, Any]]:
        reply = self._request("call", name=name, args=encode(list(args)),
                              kwargs=encode(dict(kwargs)), forbid=list(forbid))
        report = {"used": list(reply.get("used", [])), "tampered": bool(reply.get("tampered"))}
        if "error" in reply:
            _raise_student(reply["error"])
        return decode(reply.get("value")), report

    def launch(self, check: str, name: str, world_size: int, args: Sequence[Any],
               forbid: Sequence[str] = ()) -> dict[str, Any]:
        before = self._box().loopback_tx_bytes()
        reply = self._request("launch", check=check, name=name, world_size=world_size,
                              args=encode(list(args)), forbid=list(forbid))
        after = self.box.loopback_tx_bytes() if self.box is not None else None
        if "error" in reply:
            _raise_student(reply["error"])
        from labkit.analysis.timeline import Timeline

        events = {"schema_version": 1, "world_size": world_size, "events": reply["events"]}
        return {"results": decode(reply["results"]), "timeline": Timeline.from_json(events),
                "wire_bytes": None if before is None or after is None else after - before}


def _stopped(limit: float, how: str) -> dict[str, Any]:
    text = (f"this cell ran for more than the {limit:g} s allowed per cell {how}. The rest "
            "of the notebook was still graded. Look for an endless loop or a wait that "
            "never ends.")
    return {"error": {"ename": "CellTimeout", "evalue": text, "traceback": ""}, "stdout": ""}


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

    def launch(self, check: str, world_size: int, args: Sequence[Any],
               forbid: Sequence[str] = ()) -> dict[str, Any]:
        return self._session.launch(check, self.name, world_size, args, forbid)

    def __repr__(self) -> str:
        return f"<student function {self.name} (in the box)>"
