"""Instructor-only grading data: answer keys, hidden inputs, hidden traces.

They live in ``<course root>/solutions/_grading/`` (see its README): not an assignment,
so never released to ``exercises/``, and not part of the ``labkit`` package students
install. Autograding loads ``<assignment>.py`` from there into the grader's process,
outside the student's box, where the hidden tests refer to it as ``grader``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from labkit.base.errors import LabError

FOLDER = "_grading"


def folder(root: Path, source_directory: str = "solutions") -> Path:
    return Path(root) / source_directory / FOLDER


def load(assignment: str, root: Path, source_directory: str = "solutions") -> ModuleType | None:
    """The instructor module for ``assignment``, or None when this course has none."""
    path = folder(root, source_directory) / f"{assignment}.py"
    if not path.is_file():
        return None
    name = f"labkit_instructor_{assignment}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise LabError(f"cannot load instructor data {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
