"""A keyed JSON cache of this machine's measurements: one file of entries by key, one lock.

``labkit calibrate``'s peak (``peak_flops.json``) and the planner's step cost of this machine
(``step_cost.json``) are both measured once and read many times, keyed by what they depend
on (``labkit.base.places.machine_key`` plus their own parts). ``KeyedCache`` is that pattern
once: the file lives in ``labkit.base.places.cache_dir()`` (``$LABKIT_CACHE``), entries are
read whole (a missing, unreadable or malformed file is an empty cache), written with
``labkit.base.files.write_json_atomic`` (a reader sees the old file or the new one), and
``locked()`` holds ``labkit.base.files.exclusive`` on a sibling ``.lock`` so that of several
processes one measures while the rest wait and read. The cache is best effort: where it
cannot be created or written (a read-only HOME, a full disk) a ``RuntimeWarning`` says so
and the caller's measurement is simply not kept. Torch-free.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from labkit.base import places
from labkit.base.files import exclusive, write_json_atomic


class KeyedCache:
    """``$LABKIT_CACHE/<name>.json``: a JSON object of entries, each a JSON object by key."""

    def __init__(self, name: str, *, label: str, what: str) -> None:
        self.name = name
        """The file's stem (``peak_flops`` -> ``peak_flops.json`` and ``peak_flops.lock``)."""
        self.label = label
        """Which cache, for the warning ("calibration": "the calibration cache ...")."""
        self.what = what
        """What is measured again when nothing is kept, for the warning ("the peak")."""

    @property
    def path(self) -> Path:
        """The JSON file, in the cache directory as it is now (the env may change)."""
        return places.cache_dir() / f"{self.name}.json"

    @property
    def lock_path(self) -> Path:
        return places.cache_dir() / f"{self.name}.lock"

    def load(self) -> dict[str, Any]:
        """Every entry (an empty dict where the file is missing, unreadable or not an object)."""
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str) -> dict[str, Any] | None:
        """The entry under ``key``, or None (absent, or not a JSON object)."""
        entry = self.load().get(key)
        return entry if isinstance(entry, dict) else None

    def put(self, key: str, entry: dict[str, Any]) -> bool:
        """Keep ``entry`` under ``key``, the other entries unchanged (False, with a warning,
        where the file cannot be written). Call it inside ``locked()``: read, change and
        write are one step only there."""
        data = self.load()
        data[key] = entry
        try:
            write_json_atomic(self.path, data, indent=1)
        except OSError as exc:
            self._warn("written", exc)
            return False
        return True

    @contextlib.contextmanager
    def locked(self) -> Iterator[bool]:
        """Hold the cache's lock for a ``with`` block (True), or no lock (False, with a
        warning) where the cache directory cannot be created: then nothing is kept."""
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(exclusive(self.lock_path))
            except OSError as exc:
                self._warn("created", exc)
                yield False
                return
            yield True

    def _warn(self, how: str, exc: OSError) -> None:
        reason = exc.strerror or str(exc)
        warnings.warn(f"the {self.label} cache {str(places.cache_dir())!r} cannot be {how} ({reason}): "
                      f"{self.what} is measured again next time (set LABKIT_CACHE to a "
                      f"writable directory to keep it, e.g. LABKIT_CACHE=/tmp/labkit-cache)",
                      RuntimeWarning, stacklevel=4)
