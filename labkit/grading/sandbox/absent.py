"""Stands in, inside a grading box, for a labkit module the graded part forbids.

When a part asks the student to compute what a labkit module computes (``labkit.theory``
for problem set 1, ``labkit.schedules`` for the 1F1B plan, labkit's own ring for the
ring all-reduce), the box that runs it does not contain that module at all: its folder
is an empty read-only mount holding only this file as ``__init__.py``. Watching for
calls from inside the student's interpreter is not enough: whoever owns the interpreter
can switch the watcher off. Here there is nothing to call.

Importing the name still works (``from labkit import theory`` in an exploration cell does
not break the rest of the cell); using anything from it raises :class:`AbsentInGrading`,
which the grader reports as a call to the forbidden module.
"""

from __future__ import annotations

from typing import NoReturn


class AbsentInGrading(ImportError):
    """The student's code used a labkit module that is absent while this part is graded."""


def __getattr__(name: str) -> NoReturn:
    if name.startswith("__"):
        raise AttributeError(name)
    raise AbsentInGrading(f"{__name__}.{name} is not available while this part is graded: "
                          "the exercise asks you to do that work yourself")
