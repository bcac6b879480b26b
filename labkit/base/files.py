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
* ``dir_problem(path)``: why a run could not write files in a directory, found before the
  run starts by trying (create it, create and remove a file in it, look at the free space).
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


def _mode_for(path: Path) -> int:
    """The permissions ``open(path, "w")`` would leave: the old file's, else 0666 less the
    umask (read from /proc, since ``os.umask`` can only be read by setting it)."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        pass
    try:
        status = Path("/proc/self/status").read_text()
        umask = int(next(line.split()[1] for line in status.splitlines()
                         if line.startswith("Umask:")), 8)
    except (OSError, StopIteration, ValueError):
        umask = 0o022
    return 0o666 & ~umask


def write_atomic(path: str | Path, data: bytes | str) -> Path:
    """Replace ``path`` with ``data`` all at once (see the module docstring); returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, _mode_for(path))  # mkstemp's 0600 would make a shared trace private
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


MIN_FREE_BYTES = 1 << 20
"""Room a run's output directory must have before it starts: a first write (a trace, a
checkpoint's metadata) must not be the one that finds the disk full."""


def free_bytes(path: str | Path) -> int:
    """Bytes an unprivileged write can still use on the file system holding ``path``."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def dir_problem(path: str | Path) -> str | None:
    """Why files cannot be written in the directory ``path`` (None: they can), as a phrase
    that follows the path ("is a regular file, not a directory"). Found by trying: create
    it and its parents, create and remove a file in it (permission bits alone lie: root
    passes them yet cannot write in ``/proc`` or on a read-only mount), then check that at
    least ``MIN_FREE_BYTES`` are free. Leaves the directory behind when it creates one."""
    target = Path(path)
    if target.is_symlink() and not target.exists():
        return "is a symbolic link that leads nowhere (a loop, or its target is missing)"
    if target.exists() and not target.is_dir():
        return "is a regular file, not a directory" if target.is_file() else "is not a directory"
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot be created ({exc.strerror or exc})"
    try:
        fd, probe = tempfile.mkstemp(prefix=".labkit-probe-", dir=target)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"cannot be written to ({exc.strerror or exc})"
    try:
        free = free_bytes(target)
    except OSError:
        return None  # no statvfs here: the write itself will tell
    if free < MIN_FREE_BYTES:
        return f"is on a full disk ({free} bytes free, at least {MIN_FREE_BYTES} needed)"
    return None


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
