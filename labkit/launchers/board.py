"""A tiny shared-memory status board the supervisor and its ranks both map.

Three int32 slots per rank: the step it is on (for the progress bar and for naming where a
hung run stopped), whether it is blocked inside communication right now (1) or not (0),
and the first step it entered plus one (0: not in a step yet). The last one is written
once, by the rank's first step (``StepSlot``): the supervisor times steps from there, so
a rank's start-up (importing torch when it is exec'd, the rendezvous, building the model)
is not taken for step time when a timeout tells a slow run from a stuck one. A rank writes
a slot with one memory store; the supervisor reads without locks.
"""

from __future__ import annotations

import mmap
import os


class Slot:
    """One int32 cell with a ``.value`` attribute (the ``multiprocessing.Value`` interface)."""

    __slots__ = ("_index", "_view")

    def __init__(self, view: memoryview, index: int):
        self._view, self._index = view, index

    @property
    def value(self) -> int:
        return int(self._view[self._index])

    @value.setter
    def value(self, v: int) -> None:
        self._store(v)

    def _store(self, v: int) -> None:
        self._view[self._index] = v


class StepSlot(Slot):
    """The step slot a rank writes (``ctx.step``): its first write also marks the step the
    rank began with in the ``began`` slot."""

    __slots__ = ("_began", "_marked")

    def __init__(self, view: memoryview, index: int, began: int):
        super().__init__(view, index)
        self._began, self._marked = began, False

    def _store(self, v: int) -> None:
        self._view[self._index] = v
        if not self._marked:
            self._marked = True
            self._view[self._began] = v + 1


SLOTS = 3
"""int32 slots per rank: step, in-communication flag, first step + 1."""


class Board:
    def __init__(self, mm: mmap.mmap, world_size: int):
        self._mm = mm
        self._view = memoryview(mm).cast("i")
        self.world_size = world_size

    @classmethod
    def create(cls, path: str, world_size: int) -> Board:
        with open(path, "wb") as f:
            f.write(b"\0" * (4 * SLOTS * world_size))
        return cls.open(path, world_size)

    @classmethod
    def open(cls, path: str, world_size: int) -> Board:
        fd = os.open(path, os.O_RDWR)
        try:
            mm = mmap.mmap(fd, 4 * SLOTS * world_size)
        finally:
            os.close(fd)
        return cls(mm, world_size)

    def progress(self, rank: int) -> Slot:
        """The step rank ``rank`` is on (what the supervisor reads)."""
        return Slot(self._view, SLOTS * rank)

    def steps(self, rank: int) -> StepSlot:
        """The step slot rank ``rank`` itself writes: its first write marks ``began``."""
        return StepSlot(self._view, SLOTS * rank, SLOTS * rank + 2)

    def status(self, rank: int) -> Slot:
        """1 while rank ``rank`` is inside communication (``labkit.trace.comm``), else 0."""
        return Slot(self._view, SLOTS * rank + 1)

    def began(self, rank: int) -> Slot:
        """The first step rank ``rank`` entered, plus one; 0 until it enters one."""
        return Slot(self._view, SLOTS * rank + 2)

    def close(self) -> None:
        self._view.release()
        self._mm.close()
