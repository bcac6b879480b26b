"""A tiny shared-memory status board the supervisor and its ranks both map.

Two int32 slots per rank: the step it is on (for the progress bar and for naming where a
hung run stopped) and whether it is blocked inside communication right now (1) or not (0).
A rank writes a slot with one memory store; the supervisor reads without locks.
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
        self._view[self._index] = v


class Board:
    def __init__(self, mm: mmap.mmap, world_size: int):
        self._mm = mm
        self._view = memoryview(mm).cast("i")
        self.world_size = world_size

    @classmethod
    def create(cls, path: str, world_size: int) -> Board:
        with open(path, "wb") as f:
            f.write(b"\0" * (8 * world_size))
        return cls.open(path, world_size)

    @classmethod
    def open(cls, path: str, world_size: int) -> Board:
        fd = os.open(path, os.O_RDWR)
        try:
            mm = mmap.mmap(fd, 8 * world_size)
        finally:
            os.close(fd)
        return cls(mm, world_size)

    def progress(self, rank: int) -> Slot:
        return Slot(self._view, 2 * rank)

    def status(self, rank: int) -> Slot:
        return Slot(self._view, 2 * rank + 1)

    def close(self) -> None:
        self._view.release()
        self._mm.close()
