"""What a committed checkpoint is on disk, and how a resume tells a good one from a bad one.

Teaches: "the rename happened" proves a save *finished*; it does not prove the bytes are
still the ones that were written. A flipped bit on disk, a file truncated by a full disk or
a careless copy, a deleted index: DCP would load most of these without complaint and the
run would continue from weights nobody saved. So a save writes, before its commit marker,
a manifest with the size and SHA-256 of every file (each rank's ``.distcp`` shard, DCP's
``.metadata`` index, ``meta.json``, each ``rank_R.json``), and the marker ``COMPLETE``
holds the SHA-256 of the manifest. The same idea as the per-file checksums in a
``safetensors`` index or a package manager's lock file.

One definition of *committed* serves the saver and the loader alike: a directory
``step_NNNNNNNN`` whose marker, manifest and files all check out (``verify``). A resume
takes the newest committed checkpoint and says which newer ones it skipped and why; a save
that finds an existing directory that is not committed moves it aside (``.corrupt``) and
says so, instead of refusing. Also here: the checkpoint options' config rules. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.base.errors import CheckpointError
from labkit.base.files import write_atomic
from labkit.base.validate import bool_problem, int_problem

_STEP_DIR = re.compile(r"^step_(\d{8})$")
MARKER = "COMPLETE"
MANIFEST = "manifest.json"
_FORMAT = "labkit-checkpoint-1"
_CHUNK = 1 << 20
_log = logging.getLogger("labkit.train.checkpoint")


def step_dir(root: str | Path, step: int) -> Path:
    """The committed directory of the checkpoint taken after ``step`` completed steps."""
    return Path(root) / f"step_{step:08d}"


def step_dirs(root: str | Path | None) -> list[int]:
    """Steps of every ``step_NNNNNNNN`` directory under ``root``, committed or not, oldest first."""
    if root is None or not Path(root).is_dir():
        return []
    return sorted(int(m.group(1)) for child in Path(root).iterdir()
                  if (m := _STEP_DIR.match(child.name)) and child.is_dir())


def complete_steps(root: str | Path | None) -> list[int]:
    """Steps whose directory holds a commit marker and DCP's index, oldest first (a quick
    look, no checksums: ``verify`` decides whether one can be loaded)."""
    if root is None:
        return []
    return [s for s in step_dirs(root) if (step_dir(root, s) / MARKER).is_file()
            and (step_dir(root, s) / ".metadata").is_file()]


def latest_step(root: str | Path | None) -> int | None:
    steps = complete_steps(root)
    return steps[-1] if steps else None


@dataclass(frozen=True)
class Defect:
    """Why one checkpoint directory cannot be loaded: the file and the check it failed."""

    directory: str
    file: str
    check: str
    """marker | manifest | missing | size | sha256 | step"""
    detail: str

    def describe(self) -> str:
        return f"{self.directory}/{self.file} failed the {self.check} check ({self.detail})"

    def to_json(self) -> dict[str, Any]:
        return {"checkpoint": Path(self.directory).name, "file": self.file,
                "check": self.check, "detail": self.detail}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def seal(directory: Path) -> None:
    """Write the manifest of every file in ``directory``, then the marker naming the
    manifest's hash (call after every shard is on disk, before the commit rename)."""
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.name not in
                   (MARKER, MANIFEST))
    manifest = {"format": _FORMAT, "files": {
        p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in files}}
    data = json.dumps(manifest, indent=1, sort_keys=True).encode()
    write_atomic(directory / MANIFEST, data)
    write_atomic(directory / MARKER, json.dumps(
        {"format": _FORMAT, "manifest_sha256": hashlib.sha256(data).hexdigest()}).encode())


def verify(directory: Path) -> Defect | None:
    """None when ``directory`` is a committed checkpoint whose every byte is as saved;
    else the first file that is not, and the check it failed."""
    d = str(directory)
    # 1. the marker: present, and naming the manifest's hash
    try:
        marker = json.loads((directory / MARKER).read_bytes())
        want = marker["manifest_sha256"]
    except FileNotFoundError:
        return Defect(d, MARKER, "marker", "the commit marker is missing")
    except (OSError, ValueError, KeyError, TypeError):
        return Defect(d, MARKER, "marker", "the commit marker does not name a manifest "
                      "(damaged, or written by a labkit without checksums)")
    # 2. the manifest: present and exactly the one the marker committed
    try:
        data = (directory / MANIFEST).read_bytes()
    except OSError:
        return Defect(d, MANIFEST, "missing", "the manifest is missing")
    if hashlib.sha256(data).hexdigest() != want:
        return Defect(d, MANIFEST, "sha256", "the manifest is not the one the marker committed")
    files: dict[str, Any] = json.loads(data)["files"]
    if ".metadata" not in files:
        return Defect(d, ".metadata", "missing", "DCP's index is not in the manifest")
    # 3. every file: present, its size, its bytes (the index first: every load reads it)
    for name in sorted(files, key=lambda n: (n != ".metadata", n)):
        path, entry = directory / name, files[name]
        if not path.is_file():
            return Defect(d, name, "missing", "the file is gone")
        size = path.stat().st_size
        if size != entry["bytes"]:
            return Defect(d, name, "size", f"{size} bytes on disk, {entry['bytes']} saved"
                          + (": truncated" if size < entry["bytes"] else ""))
        if sha256_file(path) != entry["sha256"]:
            return Defect(d, name, "sha256", "its bytes changed since the save")
    # 4. the step: the one meta.json recorded, not whatever the directory was renamed to
    named = _STEP_DIR.match(directory.name)
    try:
        saved = json.loads((directory / "meta.json").read_bytes()).get("step")
    except (OSError, ValueError, AttributeError):
        saved = None
    if named and saved is not None and saved != int(named.group(1)):
        return Defect(d, "meta.json", "step", f"the checkpoint was saved after step {saved}, "
                      f"but its directory is named for step {int(named.group(1))}")
    return None


def newest_good(root: str | Path) -> tuple[int | None, list[Defect]]:
    """The newest step whose directory verifies, and the defects of every newer one."""
    skipped: list[Defect] = []
    for step in reversed(step_dirs(root)):
        defect = verify(step_dir(root, step))
        if defect is None:
            return step, skipped
        skipped.append(defect)
    return None, skipped


def move_aside(directory: Path) -> Path:
    """Rename a directory that is not a committed checkpoint to ``<name>.corrupt`` (kept,
    for a look; never loaded: the loader reads only ``step_NNNNNNNN``)."""
    target = directory.with_name(directory.name + ".corrupt")
    n = 1
    while target.exists():
        n += 1
        target = directory.with_name(f"{directory.name}.corrupt{n}")
    os.rename(directory, target)
    return target


def choose_resume_step(ctx: Any, root: str | Path) -> tuple[int | None, list[Defect]]:
    """Rank 0 picks the newest checkpoint that verifies and tells every rank, with the newer
    ones it skipped; only broken checkpoints under ``root`` raise ``CheckpointError``."""
    step, skipped = ctx.comm.broadcast_object(newest_good(root) if ctx.rank == 0 else None)
    if step is None and skipped:
        raise CheckpointError(
            f"no checkpoint under {root} can be loaded: "
            + "; ".join(d.describe() for d in skipped)
            + ". Move or delete these directories, or resume from another checkpoint_dir")
    for d in skipped if ctx.rank == 0 else []:
        _log.warning("skipping checkpoint %s: %s", Path(d.directory).name, d.describe())
    return step, skipped


def checkpoint_problems(root: str | None, every: int, resume: bool) -> list[str]:
    """Config rules shared by every strategy with checkpoint options (torch-free)."""
    problems = [p for p in (
        None if root is None or isinstance(root, (str, os.PathLike)) else
        f"checkpoint_dir ({root!r}) must be a path (str) or None, not {type(root).__name__}",
        int_problem("checkpoint_every", every, 0, example=5, why=" (steps; 0: never save)"),
        bool_problem("resume", resume)) if p is not None]
    if problems:
        return problems
    if every < 0:
        problems.append(f"checkpoint_every ({every}) must be >= 0 steps (0: never save); "
                        f"e.g. checkpoint_every=5")
    if (every > 0 or resume) and not root:
        problems.append(f"checkpoint_every ({every}) / resume ({resume}) need checkpoint_dir; "
                        f"e.g. checkpoint_dir='ckpt', checkpoint_every=5")
    elif resume and root and not Path(root).is_dir():
        warnings.warn(f"resume=True, but checkpoint_dir {str(root)!r} does not exist: there is "
                      f"nothing to resume, so the run starts at step 0", UserWarning, stacklevel=2)
    if root and not resume and complete_steps(root):
        problems.append(f"checkpoint_dir {root!r} already holds checkpoints (steps "
                        f"{complete_steps(root)}); pass resume=True (--resume) to continue from "
                        f"the last one, or use an empty directory")
    return problems
