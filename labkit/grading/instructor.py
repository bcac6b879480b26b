"""Instructor-only grading data: answer keys, hidden inputs, hidden traces.

They live in ``<course root>/solutions/_grading/`` (see its README): not an assignment,
so never released to ``exercises/``, and not part of the ``labkit`` package students
install. Autograding loads ``<assignment>.py`` from there into the grader's process,
outside the student's box, where the hidden tests refer to it as ``grader``. A class's
course folder holds its own ``course_secret`` there, which replaces each module's committed
``SECRET`` (the one in the source is public wherever the source is).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from labkit.base.errors import LabError

FOLDER = "_grading"
SECRET_FILE = "course_secret"
"""The course's own secret beside the modules (``labkit.grading.keys`` writes it)."""


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
    secret = folder(root, source_directory) / SECRET_FILE
    if secret.is_file() and hasattr(module, "SECRET"):
        # a class's own secret (labkit course hub writes it): the committed one is public
        setattr(module, "SECRET", secret.read_text().strip())  # noqa: B010
    return module
