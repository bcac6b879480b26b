"""The grader's side of a graded notebook: the boxes, their limits, and proxies.

A :class:`Session` owns the boxes of one notebook:

* the **main box** runs every student cell under the per-cell limits; a cell that does not
  come back, or that runs into a limit (:mod:`limits`: processes, memory, ``/tmp``, CPU),
  is stopped, a fresh box starts and the cells that did finish are replayed, so the rest
  of the notebook is still graded; the cell gets a line saying which limit stopped it;
* a **restricted box** per set of forbidden modules: a call whose part forbids, say,
  ``labkit.theory`` runs where that module is absent (:mod:`absent`), after the student's
  cells are replayed there;
* the **rank boxes** of relayed exercises (:mod:`relay`): one box per rank.

A test cell in the grader gets, for each student name it uses, either the plain value
(:mod:`wire`) or a :class:`RemoteFunction`: calling it sends the arguments into a box and
returns what the student's function returned, as plain data. The test cell as a whole has
its own wall and CPU limits, and the whole notebook has a wall and a CPU budget: once it
is spent, later cells are not run and their tests score what they can without them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from labkit.grading.sandbox import procfs
from labkit.grading.sandbox.box import Box, BoxError, BoxLimit, BoxTimeout
from labkit.grading.sandbox.budget import NOTE, Budget
from labkit.grading.sandbox.limits import Limits
from labkit.grading.sandbox.proxy import (
    CellTimeout,
    RemoteFunction,
    StudentError,
    absent_used,
    raise_student,
)
from labkit.grading.sandbox.rank_boxes import RankBoxes
from labkit.grading.sandbox.wire import decode, encode

GRACE_S = 3.0  # after the soft limit (SIGINT in the box), how long before the box is killed
BOX_START_S = 60.0


__all__ = ["CellTimeout", "RemoteFunction", "Session", "StudentError"]


class Session:
    """The boxes of one notebook, the replay log that rebuilds them, and their budgets."""

    def __init__(self, *, mode: str | None = None, course_root: Path | None = None,
                 files: Mapping[str, bytes] | None = None, cell_timeout: float = 30.0,
                 limits: Limits | None = None, cgroup_parent: str | None = None):
        self.mode, self.course_root, self.files = mode, course_root, dict(files or {})
        self.cell_timeout = float(cell_timeout)
        self.limits = limits or Limits()
        self.cgroup_parent = cgroup_parent
        self.replay: list[str] = []
        self.restarts = 0
        self.deadline: float | None = None
        self.exhausted = False
        self.box: Box | None = None
        self.restricted: dict[tuple[str, ...], tuple[Box, int]] = {}
        self.every: list[Box] = []
        self.ranks = RankBoxes(mode=mode, limits=self.limits, cgroup_parent=cgroup_parent,
                               course_root=course_root)
        self.budget = Budget(self.limits, self._cpu_s, lambda: self.box)

    # ---- life cycle ---------------------------------------------------------------------
    def _new_box(self, absent: Sequence[str] = ()) -> Box:
        box = Box(mode=self.mode, course_root=self.course_root, files=self.files,
                  limits=self.limits, absent=absent, cgroup_parent=self.cgroup_parent)
        self.every.append(box)
        return box.start(BOX_START_S)

    def start(self) -> Session:
        self.box = self._new_box()
        return self

    def close(self) -> None:
        for box, _ in self.restricted.values():
            box.stop()
        self.restricted.clear()
        self.ranks.close()
        if self.box is not None:
            self.box.stop()
            self.box = None

    def _restart(self) -> None:
        """A fresh main box with the finished cells run again (each under the same limit)."""
        if self.box is not None:
            self.box.stop()
        self.restarts += 1
        self.box = self._new_box()
        self.replay = self._replay_into(self.box, self.replay, keep_failed=False)

    def _replay_into(self, box: Box, sources: list[str], keep_failed: bool = True
                     ) -> list[str]:
        """Run ``sources`` in ``box`` again; the cells that still finish (all, if ``keep_failed``)."""
        kept = []
        for source in sources:
            try:
                reply = box.request("run", self.cell_timeout + GRACE_S, source=source,
                                    limit=self.cell_timeout)
            except BoxError:
                if not box.alive():
                    box.start(BOX_START_S)
                continue
            if keep_failed or reply.get("error", {}).get("ename") != "KeyboardInterrupt":
                kept.append(source)
        return kept

    def _box(self) -> Box:
        if self.box is None or not self.box.alive():
            raise BoxError("the box is not running")
        return self.box

    def _cpu_s(self) -> float:
        """CPU seconds every box of this notebook used so far (one reading of /proc)."""
        now = procfs.table()
        for box in self.every:
            if box.alive():
                box.usage(now)
        return sum(b.cpu_s for b in self.every) + self.ranks.cpu_s(now)

    @property
    def notes(self) -> list[str]:
        """Lines saying which limit stopped something in the current cell (for its output)."""
        return self.budget.notes

    @property
    def mode_used(self) -> str:
        return self.box.mode if self.box is not None else str(self.mode)

    # ---- student cells --------------------------------------------------------------------
    def run_cell(self, source: str) -> dict[str, Any]:
        """Run one student cell; a timeout or limit becomes an error reply, never an exception."""
        self.budget.begin(self.limits.cell_cpu_s)
        spent = self.budget.left()
        if spent:
            self.budget.notes.append(f"{NOTE}not run: {spent}.")
            return {"error": {"ename": "NotebookLimit", "evalue": f"not run: {spent}",
                              "traceback": ""}, "stdout": ""}
        limit = self.budget.wall(self.cell_timeout)
        box = self._box()
        before = box.hits()
        try:
            reply = box.request("run", limit + GRACE_S, self.budget.watch, source=source, limit=limit)
        except BoxTimeout:
            hit = self.budget.hits(box, before, None)
            self._restart()
            self.budget.noted(hit, "it was stopped and its box started again without it.")
            return _stopped(limit, "and did not stop when interrupted; the box was restarted")
        except BoxLimit as exc:
            self._restart()
            self.budget.notes.append(f"{NOTE}{exc}; it was stopped and its box started again.")
            return {"error": {"ename": "CellLimit", "evalue": str(exc), "traceback": ""},
                    "stdout": ""}
        except BoxError as exc:
            hit = self.budget.hits(box, before, None)
            self._restart()
            self.budget.noted(hit, "its box died and was started again.")
            return {"error": {"ename": "SandboxError", "evalue": f"{exc}", "traceback": ""}}
        hit = self.budget.hits(box, before, reply.get("error"))
        if reply.get("error", {}).get("ename") == "KeyboardInterrupt":
            self._restart()  # whatever it started (forks that spin on) goes with the box
            self.budget.noted(hit, "it was stopped and its box started again without it.")
            return {**_stopped(limit, "and was interrupted"), "stdout": reply.get("stdout", "")}
        if hit:  # a clean box for the rest; this cell is not replayed into it
            self._restart()
            self.budget.noted(hit, "its box was started again without it.")
            return reply
        self.replay.append(source)
        return reply

    # ---- what test cells use ----------------------------------------------------------------
    def begin_test(self, seconds: float) -> None:
        """A test cell starts: its calls into the boxes share ``seconds`` in all."""
        self.budget.begin(self.limits.test_cpu_s)
        self.deadline = time.monotonic() + self.budget.wall(seconds)
        self.exhausted = False

    def end_test(self) -> None:
        self.deadline, self.exhausted = None, False

    def remaining(self) -> float:
        if self.deadline is None:
            return self.budget.wall(self.cell_timeout)
        return max(1.0, self.deadline - time.monotonic())

    def _request(self, op: str, box: Box | None = None, **payload: Any) -> dict[str, Any]:
        if self.exhausted:  # one timeout per test cell: the rest of its calls fail at once
            raise CellTimeout("not run: an earlier call in this test ran out of time")
        spent = self.budget.left()
        if spent:
            self.exhausted = True
            raise CellTimeout(f"not run: {spent}")
        box = box or self._box()
        limit = self.remaining()
        before = box.hits()
        try:
            reply = box.request(op, limit + GRACE_S, self.budget.watch, limit=limit, **payload)
        except BoxTimeout:
            self._after_failure(box)
            self.exhausted = self.deadline is not None
            raise CellTimeout(f"stopped after {limit:.0f} s: it did not return in time "
                              "(an endless loop, or a recv without a send?)") from None
        except BoxLimit as exc:
            self._after_failure(box)
            self.exhausted = True
            self.budget.notes.append(f"{NOTE}{exc}; it was stopped.")
            raise CellTimeout(f"stopped: {exc}") from None
        except BoxError as exc:
            hit = self.budget.hits(box, before, None)
            self._after_failure(box)
            self.budget.noted(hit, "its box died.")
            raise CellTimeout(f"the student's process died: {exc}") from None
        hit = self.budget.hits(box, before, reply.get("error"))
        if hit:
            self.budget.noted(hit, "its box was started again.")
            self._after_failure(box)
        if not reply.get("ok", False):
            raise_student(reply.get("error", {}))
        if reply.get("error", {}).get("ename") == "KeyboardInterrupt":
            self.exhausted = self.deadline is not None
        return reply

    def _after_failure(self, box: Box) -> None:
        """Rebuild the box a failed request ran in (the main one, or a restricted one)."""
        if box is self.box:
            self._restart()
            return
        box.stop()
        self.restricted = {k: v for k, v in self.restricted.items() if v[0] is not box}

    def _box_for(self, forbid: Sequence[str]) -> tuple[Box, tuple[str, ...]]:
        """The box a call whose part forbids ``forbid`` runs in, caught up with every cell."""
        absent = tuple(sorted(m for m in forbid if not m.startswith("labkit.grading")))
        if not absent or self._box().mode == "none":  # nothing to hide, or no way to hide it
            return self._box(), absent
        box, done = self.restricted.get(absent, (None, 0))
        if box is None or not box.alive():
            box, done = self._new_box(absent), 0
        self._replay_into(box, self.replay[done:])
        self.restricted[absent] = (box, len(self.replay))
        return box, absent

    def describe(self, name: str) -> tuple[str, Any]:
        reply = self._request("describe", name=name)
        return reply.get("kind", "missing"), decode(reply.get("value"))

    def call(self, name: str, args: Sequence[Any], kwargs: Mapping[str, Any],
             forbid: Sequence[str] = ()) -> tuple[Any, dict[str, Any]]:
        box, absent = self._box_for(forbid)
        reply = self._request("call", box, name=name, args=encode(list(args)),
                              kwargs=encode(dict(kwargs)), forbid=list(forbid))
        report = {"used": list(reply.get("used", [])), "tampered": bool(reply.get("tampered"))}
        if "error" in reply:
            used = absent_used(reply["error"], absent)
            if used is not None:  # it reached for the module this part forbids
                return None, {"used": [used], "tampered": False}
            raise_student(reply["error"])
        return decode(reply.get("value")), report

    def launch(self, check: str, name: str, world_size: int, rank_args: Sequence[Any],
               forbid: Sequence[str] = ()) -> dict[str, Any]:
        """The student's function on ``world_size`` relayed rank boxes (:mod:`relay`)."""
        import base64

        reply = self._request("export", name=name)
        if "error" in reply:
            raise_student(reply["error"])
        blob = base64.b64decode(reply["blob"])  # opaque: only the rank boxes unpickle it
        try:
            return self.ranks.launch(blob, check, world_size, rank_args, forbid,
                                     time.monotonic() + self.remaining(), self.budget.watch)
        except BoxTimeout:
            self.exhausted = self.deadline is not None
            raise CellTimeout("stopped after the test's time limit: the ranks did not finish "
                              "(an endless loop?)") from None
        except BoxLimit as exc:
            self.exhausted = True
            self.budget.notes.append(f"{NOTE}{exc}; the ranks were stopped.")
            raise CellTimeout(f"stopped: {exc}") from None
        except BoxError as exc:
            raise CellTimeout(f"a rank's process died: {exc}") from None


def _stopped(limit: float, how: str) -> dict[str, Any]:
    text = (f"this cell ran for more than the {limit:g} s allowed per cell {how}. The rest "
            "of the notebook was still graded. Look for an endless loop or a wait that "
            "never ends.")
    return {"error": {"ename": "CellTimeout", "evalue": text, "traceback": ""}, "stdout": ""}
