"""The nbgrader course inside the repo: where things are, release regeneration, staleness.

``solutions/`` (nbgrader's *source*) is the single place exercises are written;
``exercises/`` (the *release*) is generated from it by ``nbgrader generate_assignment`` and
committed so students get it with a clone. ``release`` regenerates it; ``stale_assignments``
generates a fresh release in a temporary copy of the course and compares the notebooks'
cells (type, source, and the nbgrader ids / points / locks), ignoring volatile metadata
such as checksums' formatting, kernel info and cell ids, so a test can fail when someone
edits a solution notebook and forgets to regenerate.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from labkit.base.errors import ConfigError, LabError
from labkit.base.progress import each

CONFIG = "nbgrader_config.py"


def repo_root() -> Path:
    """The folder holding ``nbgrader_config.py`` (the labkit checkout)."""
    env = os.environ.get("LABKIT_COURSE_ROOT")
    if env:
        return Path(env).resolve()
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / CONFIG).exists():
            return parent
    cwd = Path.cwd()
    for parent in (cwd, *cwd.parents):
        if (parent / CONFIG).exists():
            return parent
    raise ConfigError(f"no {CONFIG} found above {here} or {cwd}; run from the labkit checkout "
                      "or set LABKIT_COURSE_ROOT=/path/to/labkit")


def assignments(root: Path | None = None) -> list[str]:
    """Assignment names: the folders of ``solutions/`` (of ``exercises/`` in a student's copy)."""
    root = root or repo_root()
    # a class's checkout has solutions/ closed to students (labkit.grading.keys): theirs is
    # the release
    readable = os.access(root / "solutions", os.R_OK | os.X_OK)
    src = root / "solutions" if readable else root / "exercises"
    return sorted(p.name for p in src.iterdir()
                  if p.is_dir() and not p.name.startswith((".", "_")))


def check_assignment(name: str, root: Path | None = None) -> str:
    root = root or repo_root()
    released = (root / "exercises" / name).is_dir() and not name.startswith((".", "_"))
    if released and not os.access(root / "solutions" / name, os.R_OK | os.X_OK):
        return name  # a student's copy: graded against the release (visible tests only)
    known = assignments(root)
    if name not in known:
        raise ConfigError(f"assignment ({name!r}) is not in solutions/; one of {known}; "
                          f"e.g. labkit submit {known[0] if known else 'ps1_numbers'}")
    return name


def nbgrader(args: list[str], root: Path, env: dict[str, str] | None = None,
             timeout: float = 900, on_line: Callable[[str], None] | None = None
             ) -> subprocess.CompletedProcess[str]:
    """Run ``python -m nbgrader ARGS`` in the course root (its nbgrader_config.py applies);
    ``on_line`` hears each line of its log (stderr) as nbgrader writes it."""
    full_env = dict(os.environ if env is None else env)
    full_env.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    # nbgrader runs the `alembic` script by name: put this interpreter's bin/ first on PATH
    bindir = str(Path(sys.executable).parent)
    full_env["PATH"] = bindir + os.pathsep + full_env.get("PATH", "")
    cmd = [sys.executable, "-m", "nbgrader", *args]
    try:
        if on_line is None:
            return subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=full_env,
                                  timeout=timeout, check=False)
        return _streamed(cmd, root, full_env, timeout, on_line)
    except subprocess.TimeoutExpired:
        raise LabError(f"nbgrader {args[0]} did not finish within {timeout:.0f} s and was "
                       "stopped; every cell has its own limit, so this means the machine is "
                       "far too busy or nbgrader itself hung") from None


def _streamed(cmd: list[str], root: Path, env: dict[str, str], timeout: float,
              on_line: Callable[[str], None]) -> subprocess.CompletedProcess[str]:
    """``subprocess.run`` that hands each stderr line to ``on_line`` as it comes."""
    err: list[str] = []
    with tempfile.TemporaryFile("w+") as out, \
            subprocess.Popen(cmd, cwd=root, stdout=out, stderr=subprocess.PIPE, text=True,
                             env=env) as proc:
        stopped = threading.Event()

        def stop() -> None:
            stopped.set()
            proc.kill()

        timer = threading.Timer(timeout, stop)
        timer.start()
        try:
            assert proc.stderr is not None
            for line in proc.stderr:  # ends when nbgrader exits (or is stopped)
                err.append(line)
                on_line(line.rstrip("\n"))
            proc.wait()
        finally:
            timer.cancel()
        if stopped.is_set():
            raise subprocess.TimeoutExpired(cmd, timeout)
        out.seek(0)
        return subprocess.CompletedProcess(cmd, proc.returncode, out.read(), "".join(err))


def release(root: Path | None = None, names: list[str] | None = None,
            release_dir: str | None = None, source_dir: str | None = None,
            progress: bool | None = None) -> list[Path]:
    """Regenerate ``exercises/<name>/`` from ``solutions/<name>/`` (all assignments by default).

    ``release_dir`` writes elsewhere (relative to root), e.g. to fill a gradebook without
    touching the committed release. An nbgrader process per assignment: one bar counts them
    (``progress``: ``labkit.base.progress``'s rule).
    """
    root = root or repo_root()
    (root / "course").mkdir(exist_ok=True)
    out = []
    for name in each(names or assignments(root), "releasing", unit="assignment",
                     progress=progress):
        args = ["generate_assignment", name, "--force"]
        if release_dir:
            args.append(f"--CourseDirectory.release_directory={release_dir}")
        if source_dir:
            args.append(f"--CourseDirectory.source_directory={source_dir}")
        proc = nbgrader(args, root)
        if proc.returncode != 0:
            raise RuntimeError(f"nbgrader generate_assignment {name} failed:\n{proc.stderr}")
        out.append(root / (release_dir or "exercises") / name)
    return out


def _cells(path: Path) -> list[tuple[Any, ...]]:
    import nbformat

    nb = nbformat.read(path, as_version=4)
    rows = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        rows.append((cell.cell_type, cell.source.strip(), meta.get("grade_id"),
                     bool(meta.get("grade")), bool(meta.get("solution")),
                     bool(meta.get("locked")), meta.get("points")))
    return rows


def stale_assignments(root: Path | None = None, progress: bool | None = None
                      ) -> dict[str, str]:
    """Assignments whose committed release differs from a fresh generation: name -> why
    (``progress``: the fresh release's, as ``release``)."""
    root = root or repo_root()
    problems: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="labkit-release-") as tmp:
        copy = Path(tmp)
        shutil.copy(root / CONFIG, copy / CONFIG)
        shutil.copytree(root / "solutions", copy / "solutions")
        release(copy, progress=progress)
        for name in assignments(root):
            fresh_dir, committed_dir = copy / "exercises" / name, root / "exercises" / name
            fresh = sorted(p.name for p in fresh_dir.glob("*.ipynb"))
            have = sorted(p.name for p in committed_dir.glob("*.ipynb"))
            if fresh != have:
                problems[name] = f"notebooks {have} in exercises/, fresh release has {fresh}"
                continue
            for nb in fresh:
                a, b = _cells(fresh_dir / nb), _cells(committed_dir / nb)
                if a != b:
                    diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y),
                                min(len(a), len(b)))
                    problems[name] = f"{nb}: cell {diff} differs from a fresh release"
                    break
    return problems
