"""Where labkit keeps what outlives a run: the student's state and the machine's cache.

Each platform has its own places for both (the XDG base directories on Linux, ``Library``
on macOS, ``AppData`` on Windows); ``platformdirs`` knows them, so labkit does not choose
by hand. Two settings override them, as before: ``LABKIT_HOME`` (the state: quiz progress)
and ``LABKIT_CACHE`` (the calibrated peak FLOP/s). A ``~/.labkit`` from an earlier labkit
stays in use while it exists, so no one's quiz progress is left behind. Torch-free.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from pathlib import Path

import platformdirs

APP = "labkit"
LEGACY_HOME = ".labkit"
"""The state directory under the home directory before labkit asked platformdirs."""


def state_dir() -> Path:
    """``$LABKIT_HOME``; else ``~/.labkit`` where an earlier labkit made one; else the
    platform's user data directory (``~/.local/share/labkit`` on Linux)."""
    env = os.environ.get("LABKIT_HOME")
    if env:
        return Path(env).expanduser()
    legacy = Path.home() / LEGACY_HOME
    return legacy if legacy.is_dir() else platformdirs.user_data_path(APP)


def cache_dir() -> Path:
    """``$LABKIT_CACHE``; else the platform's user cache directory (``~/.cache/labkit`` on
    Linux, where labkit kept its cache before)."""
    env = os.environ.get("LABKIT_CACHE")
    return Path(env).expanduser() if env else platformdirs.user_cache_path(APP)


def torch_build() -> str:
    """torch's version and where it is installed: a rebuilt or other torch is another key."""
    try:
        dist = metadata.distribution("torch")
    except metadata.PackageNotFoundError:
        return "none"
    where = str(dist.locate_file("torch"))
    try:
        stamp = int(Path(where, "version.py").stat().st_mtime)
    except OSError:
        stamp = 0
    return f"{dist.version}@{where}#{stamp}"


def machine_key(torch: str | None = None) -> str:
    """What a measurement cached for this machine depends on: the host, the Python, the torch
    build (``torch_build``, or ``torch`` as given) and the labkit checkout. Calibrate's peak
    and the planner's step cost add what else they depend on."""
    checkout = Path(__file__).resolve().parents[2]
    build = torch if torch is not None else torch_build()
    return f"{platform.node()}|{sys.executable}|torch {build}|labkit {checkout}"
