"""Files that survive a crash, and locks that die with their process: the one place labkit
writes a file atomically or takes a ``flock``.

* ``write_atomic(path, data)``: a temporary file in the same folder, written, flushed and
  fsync'ed, then renamed over ``path`` (``os.replace`` is atomic on POSIX), so a reader sees the
  old file or the new one, never half of one; the folder is fsync'ed too, so the rename itself
  survives a power cut. ``write_json_atomic`` is the same for a JSON document.
* ``try_lock(handle)``: an exclusive ``flock`` taken without waiting. The kernel drops it when
  the process dies, however it dies, which is how run directories and emulated-cluster
  namespaces tell a live owner from a leftover. ``exclusive(path)`` waits for the lock instead,
  for the length of a ``with`` block (one process measures a cache, the others read it).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


def fsync_dir(path: str | Path) -> None:
    """Make a rename or a new file in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: bytes | str) -> Path:
    """Replace ``path`` with ``data`` all at once (see the module docstring); returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def write_json_atomic(path: str | Path, data: Any, **dumps: Any) -> Path:
    """``write_atomic`` of ``json.dumps(data, **dumps)`` and a final newline."""
    return write_atomic(path, json.dumps(data, **dumps) + "\n")


def try_lock(handle: IO[Any]) -> bool:
    """Take an exclusive ``flock`` on the open file without waiting: False if another process
    holds it. The lock lasts while ``handle`` stays open (and dies with the process)."""
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def exclusive(path: str | Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for a ``with`` block,
    waiting for whoever holds it now."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
