"""Rank boxes of relayed exercises: one box per rank, reused from launch to launch.

A rank's box imports torch once and then runs every launch of the notebook that needs that
rank; a failed or stopped launch tears every rank box down, so the next launch starts from
fresh boxes. In a student's own kernel the same launch runs in plain processes
(:func:`run_local`): what the student sees while practising is what grading does.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from labkit.grading.sandbox import procfs
from labkit.grading.sandbox.box import Box, BoxError
from labkit.grading.sandbox.limits import Limits
from labkit.grading.sandbox.relay import Relay, RelayError
from labkit.grading.sandbox.wire import decode, encode


class RankBoxes:
    """One box per rank for relayed launches, reused from launch to launch."""

    def __init__(self, *, mode: str | None = None, limits: Limits | None = None,
                 cgroup_parent: str | None = None, course_root: Path | None = None):
        self.mode, self.limits, self.cgroup_parent = mode, limits, cgroup_parent
        self.course_root = course_root
        self.boxes: list[Box] = []
        self.every: list[Box] = []  # every box ever started (their CPU counts)
        self.absent: tuple[str, ...] = ()

    def _ensure(self, n: int, absent: tuple[str, ...], timeout: float) -> list[Box]:
        if absent != self.absent or any(not b.alive() for b in self.boxes):
            self.close()
            self.absent = absent
        while len(self.boxes) < n:
            box = Box(mode=self.mode, limits=self.limits, absent=absent, network=False,
                      cgroup_parent=self.cgroup_parent, course_root=self.course_root,
                      server="labkit.grading.sandbox.relay_rank")
            self.every.append(box)
            box.start(timeout)
            self.boxes.append(box)
        return self.boxes[:n]

    def launch(self, blob: bytes, check: str, world_size: int, rank_args: Sequence[Any],
               forbid: Sequence[str], deadline: float,
               watch: Callable[[], None] | None = None) -> dict[str, Any]:
        """Run harness ``check`` on ``world_size`` rank boxes; results, timeline, record."""
        absent = tuple(sorted(m for m in forbid if not m.startswith("labkit.grading")))
        boxes = self._ensure(world_size, absent, max(1.0, deadline - time.monotonic()))
        relay = Relay(boxes, deadline, watch)
        try:
            for r, box in enumerate(boxes):
                box.send({"op": "job", "blob": base64.b64encode(blob).decode(), "check": check,
                          "rank": r, "world_size": world_size, "args": encode(list(rank_args[r])),
                          "forbid": list(forbid)})
            results = [decode(r) for r in relay.run()]
        except BaseException:
            self.close()  # ranks may be blocked mid-job: the next launch starts fresh boxes
            raise
        return {"results": results, "timeline": relay.timeline(), "record": relay.record}

    def cpu_s(self, now: procfs.Table | None = None) -> float:
        for box in self.boxes:
            if box.alive():
                box.usage(now)
        return sum(b.cpu_s for b in self.every)

    def close(self) -> None:
        for box in self.boxes:
            box.stop()
        self.boxes = []


def run_local(fn: Callable[..., Any], check: str, world_size: int, rank_args: Sequence[Any],
              forbid: Sequence[str], timeout_s: float) -> dict[str, Any]:
    """The same relayed launch from a student's own kernel: plain processes (mode none),
    nothing absent; what the student sees while practising is what grading will do."""
    import cloudpickle

    boxes = RankBoxes(mode="none")
    try:
        return boxes.launch(cloudpickle.dumps(fn), check, world_size, rank_args, forbid,
                            time.monotonic() + timeout_s)
    except BoxError as exc:
        raise RelayError(str(exc)) from None
    finally:
        boxes.close()
