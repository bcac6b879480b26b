"""The model answers of a problem set, executed from its solution notebook.

A grader is only as good as its model answers: tests and benches check that the solution
notebook's own answers score full marks (and measure how much room the tolerances leave).
This runs the set-up cell (grade id ``psN_setup``) and every ``*_answer`` cell of
``solutions/<assignment>/<assignment>.ipynb`` in one namespace and returns it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def model_answers(assignment: str, repo: Path = REPO) -> dict[str, Any]:
    """The namespace after ``assignment``'s set-up and answer cells, e.g.
    ``model_answers("ps7_planning_at_scale")["plan_layout"]``."""
    setup = assignment.split("_", 1)[0] + "_setup"
    nb = json.loads((repo / "solutions" / assignment / f"{assignment}.ipynb").read_text())
    ns: dict[str, Any] = {}
    for cell in nb["cells"]:
        gid = cell["metadata"].get("nbgrader", {}).get("grade_id", "")
        if gid == setup or gid.endswith("_answer"):
            exec("".join(cell["source"]), ns)  # our own notebook
    return ns
