"""Events written to disk as a rank goes, so a failed run still has a timeline.

A rank normally hands in its events when it finishes. A rank that raises, is killed or
hangs never finishes, and without a spool the supervisor would have nothing to draw for
the run that failed -- the one a student most wants to look at.

So each rank appends its newly recorded events to ``RUN_DIR/events-<rank>.pkl`` at the end
of every step (a pickle and one unbuffered write, about 6 us) and once more when its code
raises. The supervisor reads the files after a failure (``read_spools``): a killed or hung
rank's timeline ends with the last step it finished. Each write is one pickled list; a
write cut short by a kill is dropped when reading.

Only plain host-clock tracers spool: a CUDA tracer's spans are events that would need a
device synchronize per write, which could hang on a stuck GPU.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

from labkit.base.events import Event
from labkit.trace.tracer import raw_to_event

_MAGIC = "labkit-spool-1"


def spool_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / f"events-{rank}.pkl"


class Spool:
    """Appends a tracer's new records to one file; ``write()`` is cheap to call every step.

    The file starts with a header (rank, the tracer's time zero, the offset onto rank 0's
    clock); each write appends the raw records taken since the last one, pickled as one
    list. Records become Events only when read, so a write costs a pickle and one syscall
    (about 6 us for a step's ten records).
    """

    def __init__(self, path: str | Path, tracer: Any, offset_ns: int):
        self.path = Path(path)
        self.tracer = tracer
        self.offset_ns = offset_ns
        self._written = 0  # tracer records already on disk
        self._file: io.RawIOBase | None = None

    def write(self) -> None:
        """Append the records taken since the last write (nothing new: no write)."""
        fresh, self._written = self.tracer.raw_since(self._written)
        if not fresh:
            return
        if self._file is None:  # unbuffered: each write reaches the OS, and survives a kill
            self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115 - lives with the rank
            self._file.write(pickle.dumps((_MAGIC, self.tracer.rank, self.tracer.origin_ns,
                                           self.offset_ns)))
        self._file.write(pickle.dumps(fresh, protocol=pickle.HIGHEST_PROTOCOL))


def read_spool(path: str | Path) -> list[Event]:
    """Every complete write in one rank's spool file (a torn last write is skipped)."""
    out: list[Event] = []
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below, after a possibly torn read
    except OSError:
        return out
    with f:
        try:
            magic, rank, origin, offset = pickle.load(f)
            if magic != _MAGIC:
                return out
            while True:
                out.extend(raw_to_event(rank, raw, origin, offset) for raw in pickle.load(f))
        except EOFError:
            pass
        except Exception:  # noqa: BLE001 - a write cut short by a kill; keep the rest
            pass
    return out


def read_spools(run_dir: str | Path, world_size: int) -> list[Event]:
    """Every rank's spooled events, sorted by start time."""
    events = [e for r in range(world_size) for e in read_spool(spool_path(run_dir, r))]
    events.sort(key=lambda e: e.start_ns)
    return events
