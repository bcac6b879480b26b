"""Events written to disk as a rank goes, so a failed run still has a timeline.

A rank normally hands in its events when it finishes. A rank that raises, is killed or
hangs never finishes, and without a spool the supervisor would have nothing to draw for
the run that failed -- the one a student most wants to look at.

So each rank appends its newly recorded events to ``RUN_DIR/events-<rank>.pkl`` at the end
of every step and once more when its code raises. The supervisor reads the files after a
failure (``read_spools``): a killed or hung rank's timeline ends with the last step it
finished.

The file is mapped into the rank's memory (``mmap``, shared with the file): a step's write
is a few stores into memory, no system call, and what was stored is in the kernel's page
cache the moment it is stored, so it outlives a SIGKILL as a ``write()`` would. Each write
is one record: its bytes, then its length in the four bytes before them; the length is
stored last, so a write a kill cut short leaves a zero length, which ends the reading.

A record's first byte says how its spans are written. Most steps record only spans that
carry a step and a CPU time (forward, backward, the optimizer, the step itself): those go as
fixed binary rows (``_ROW``: op, start, end, step, CPU time), packed straight into the
mapping: inside a training step about two thirds of the time the marshalled list took
(``bench/bench_step.py``; docs/benchmarks.md, "Measured quiet"). A write with any
other span (a collective's bytes, a microbatch, a name) is one ``marshal``-ed list (version
2: plain ints, strings, None and tuples; each op as its value); the supervisor that reads
it runs the same Python as its ranks.

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

from labkit.base.events import RAW_FIELDS, Event, Op
from labkit.trace.tracer import Raw, raw_to_event

_MAGIC = "labkit-spool-4"


_LEN = struct.Struct("<I")
"""A record's length, stored before it (0: no record here, the end)."""

_ROWS, _MARSHAL = 1, 2
"""A record's first byte: fixed rows (``_ROW`` each), or one marshalled list."""

_ROW = struct.Struct("<Bqqqq")
"""A span with a step and at most a CPU time: op (its index in ``Op``), start, end, step,
CPU ns (-1: none)."""

_OPS = tuple(Op)
_OP_INDEX = {op._value_: i for i, op in enumerate(_OPS)}
"""By value: an enum member's hash is a Python call, a string's is cached."""

_MIDDLE = (None,) * (len(RAW_FIELDS) - 2)
"""Every meta field between ``step`` and ``cpu_ns`` unset: a row's span."""

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
        if not self._append_rows(fresh):
            # an op as its value: pickling (or hashing) an enum member calls back into Python
            self._append(bytes((_MARSHAL,))
                         + marshal.dumps([(op._value_, s, e, m) for op, s, e, m in fresh], 2))

    def _append_rows(self, fresh: list[Raw]) -> bool:
        """``fresh`` as one record of fixed rows, packed in place; False (nothing committed)
        where a span carries more than a step and a CPU time."""
        start, n = self._end + _LEN.size, 1 + len(fresh) * _ROW.size
        mm = self._room(start + n)
        pos = start + 1
        try:
            for op, s, e, m in fresh:
                if m[1:-1] != _MIDDLE:
                    break
                cpu = m[-1]
                _ROW.pack_into(mm, pos, _OP_INDEX[op._value_], s, e, m[0],
                               -1 if cpu is None else cpu)
                pos += _ROW.size
            else:
                mm[start] = _ROWS
                self._commit(start, n)
                return True
        except struct.error:  # no step (None), or a reading that is not a plain int
            pass
        # what rows were packed is overwritten: the same spans marshalled take more bytes
        # (at least 39 a span, a row 33), so no stale row is left past the record's end
        return False

    def _append(self, data: bytes) -> None:
        """One record: its bytes, then its length (the commit)."""
        start, n = self._end + _LEN.size, len(data)
        mm = self._room(start + n)
        mm[start:start + n] = data
        self._commit(start, n)

    def _room(self, end: int) -> mmap.mmap:
        """The mapping, with room up to ``end`` and the next record's zero length after it."""
        mm = self._map
        if mm is None or end + _LEN.size > len(mm):
            mm = self._grow(end + _LEN.size)
        return mm

    def _commit(self, start: int, n: int) -> None:
        """Store the length of the ``n`` bytes at ``start``: the record is in the file."""
        assert self._map is not None
        _LEN.pack_into(self._map, self._end, n)
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


def _raws(record: bytes) -> Iterator[Raw]:
    """The spans of one record (either kind)."""
    if record[0] == _ROWS:
        for op, s, e, step, cpu in _ROW.iter_unpack(record[1:]):
            yield _OPS[op], s, e, (step, *_MIDDLE, None if cpu < 0 else cpu)
    elif record[0] == _MARSHAL:
        for op, s, e, m in marshal.loads(record[1:]):
            yield Op(op), s, e, m
    else:
        raise ValueError(f"not a spool record (kind {record[0]})")


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
            out.extend(raw_to_event(rank, raw, origin, offset) for raw in _raws(record))
    except Exception:  # noqa: BLE001 - not a spool, or a record a kill cut; keep the rest
        pass
    return out


def read_spools(run_dir: str | Path, world_size: int) -> list[Event]:
    """Every rank's spooled events, sorted by start time."""
    events = [e for r in range(world_size) for e in read_spool(spool_path(run_dir, r))]
    events.sort(key=lambda e: e.start_ns)
    return events
