"""Events written to disk as a rank goes, so a failed run still has a timeline.

A rank normally hands in its events when it finishes. A rank that raises, is killed or
hangs never finishes, and without a spool the supervisor would have nothing to draw for
the run that failed -- the one a student most wants to look at.

So each rank appends its newly recorded events to ``RUN_DIR/events-<rank>.pkl`` at the end
of every step and once more when its code raises. The supervisor reads the files after a
failure (``read_spools``): a killed or hung rank's timeline ends with the last step it
finished.

The file is mapped into the rank's memory (``mmap``, shared with the file): a step's write
is one ``marshal.dumps`` and a memory copy, no system call, and what was copied is in the kernel's page
cache the moment it is stored, so it outlives a SIGKILL as a ``write()`` would. Each write
is one record: the list, then its length in the four bytes before it; the length is stored
last, so a write a kill cut short leaves a zero length, which ends the reading. The list is
written with ``marshal`` (version 2: plain ints, strings, None and tuples, no references),
about half the time ``pickle`` takes inside a training step; the supervisor that reads it
runs the same Python as its ranks.

Only plain host-clock tracers spool: a CUDA tracer's spans are events that would need a
device synchronize per write, which could hang on a stuck GPU.
"""

from __future__ import annotations

import marshal
import mmap
import os
import pickle
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from labkit.base.events import Event, Op
from labkit.trace.tracer import raw_to_event

_MAGIC = "labkit-spool-3"


_LEN = struct.Struct("<I")
"""A record's length, stored before it (0: no record here, the end)."""

_FIRST_SIZE = 1 << 16
"""The mapping's first size; it doubles when full (a step's write is about 150 bytes)."""


def spool_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / f"events-{rank}.pkl"


class Spool:
    """Appends a tracer's new records to one file; ``write()`` is cheap to call every step.

    The file starts with a header (rank, the tracer's time zero, the offset onto rank 0's
    clock; pickled); each write appends the raw records taken since the last one as one
    marshalled list (each op as its value). Records become Events only when read.
    """

    def __init__(self, path: str | Path, tracer: Any, offset_ns: int):
        self.path = Path(path)
        self.tracer = tracer
        self.offset_ns = offset_ns
        self._written = 0  # tracer records already on disk
        self._file: IO[bytes] | None = None
        self._map: mmap.mmap | None = None
        self._end = 0  # bytes of records in the file

    def write(self) -> None:
        """Append the records taken since the last write (nothing new: no write)."""
        fresh, self._written = self.tracer.raw_since(self._written)
        if not fresh:
            return
        if self._file is None:  # the file appears with the first records, header first
            self._file = open(self.path, "w+b")  # noqa: SIM115 - lives with the rank
            self._append(pickle.dumps((_MAGIC, self.tracer.rank, self.tracer.origin_ns,
                                       self.offset_ns)))
        # an op as its value: pickling (or hashing) an enum member calls back into Python
        self._append(marshal.dumps([(op._value_, s, e, m) for op, s, e, m in fresh], 2))

    def _append(self, data: bytes) -> None:
        """One record: its bytes, then its length (the commit)."""
        start, n = self._end + _LEN.size, len(data)
        mm = self._map
        if mm is None or start + n + _LEN.size > len(mm):  # room for the next zero length too
            mm = self._grow(start + n + _LEN.size)
        mm[start:start + n] = data
        _LEN.pack_into(mm, self._end, n)
        self._end = start + n

    def _grow(self, need: int) -> mmap.mmap:
        """Map the file again, at least ``need`` bytes (zeros past the end: no record).
        Closing and mapping again, not ``mmap.resize``, which macOS lacks."""
        assert self._file is not None
        size = max(_FIRST_SIZE, 2 * (len(self._map) if self._map is not None else 0))
        while size < need:
            size *= 2
        if self._map is not None:
            self._map.close()
        os.ftruncate(self._file.fileno(), size)
        self._map = mmap.mmap(self._file.fileno(), size)
        return self._map


def _records(data: bytes) -> Iterator[bytes]:
    """Each complete record in a spool file's bytes, in order."""
    pos = 0
    while pos + _LEN.size <= len(data):
        (n,) = _LEN.unpack_from(data, pos)
        pos += _LEN.size
        if n == 0 or pos + n > len(data):
            return
        yield data[pos:pos + n]
        pos += n


def read_spool(path: str | Path) -> list[Event]:
    """Every complete write in one rank's spool file (a torn last write is skipped)."""
    out: list[Event] = []
    try:
        data = Path(path).read_bytes()
    except OSError:
        return out
    records = _records(data)
    try:
        magic, rank, origin, offset = pickle.loads(next(records))
        if magic != _MAGIC:
            return out
        for record in records:
            out.extend(raw_to_event(rank, (Op(op), s, e, m), origin, offset)
                       for op, s, e, m in marshal.loads(record))
    except Exception:  # noqa: BLE001 - not a spool, or a record a kill cut; keep the rest
        pass
    return out


def read_spools(run_dir: str | Path, world_size: int) -> list[Event]:
    """Every rank's spooled events, sorted by start time."""
    events = [e for r in range(world_size) for e in read_spool(spool_path(run_dir, r))]
    events.sort(key=lambda e: e.start_ns)
    return events
