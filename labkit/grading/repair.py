"""A submission's nbgrader metadata checked against the gradebook before nbgrader reads it.

nbgrader trusts the metadata a student's notebook carries: ``schema_version: 99`` in one
cell raises ``SchemaTooNewError``, which stops ``nbgrader autograde`` for every student
after her; a cell the student marked as a grade cell the assignment does not have, or a
grade id that is not a string, fails that notebook's validation, so it gets no score and
no feedback. ``RepairStudentMetadata`` runs first in autograde's sanitizing phase
(``Autograde.sanitize_preprocessors`` in ``nbgrader_config.py``):

1. a cell claiming a grade id the gradebook knows gets the gradebook's flags, points and
   the current schema version (what the assignment says it is, whatever the student wrote);
2. a cell claiming an id the gradebook does not know, a second cell with the same id, or
   metadata that is not a mapping loses its nbgrader marking: it is graded as any other
   student cell (it earns nothing by itself);
3. text that cannot be written as UTF-8 is escaped (``sanitize.escape_invalid_text``);
4. each repair is logged (``labkit: ...``) and listed in a note cell at the top of the
   notebook, so the feedback says what was ignored and why.
"""

from __future__ import annotations

import html
from typing import Any

from nbformat.v4 import new_markdown_cell
from nbgrader.preprocessors import NbGraderPreprocessor

from labkit.grading.sanitize import escape_invalid_text

SCHEMA_VERSION = 3
NOTE_TITLE = "**labkit: parts of this notebook were ignored while grading**"


def _gradebook_cells(info: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """grade_id -> the metadata the assignment gives that cell (empty when unknown)."""
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(info["db_url"]) as gb:
        try:
            nb = gb.find_notebook(info["notebook"], info["assignment"])
        except MissingEntry:
            return {}
        cells: dict[str, dict[str, Any]] = {}
        for c in nb.source_cells:
            cells[c.name] = {"grade": False, "solution": False, "locked": bool(c.locked),
                             "task": False, "cell_type": c.cell_type}
        for g in nb.grade_cells:
            cells.setdefault(g.name, {"locked": False, "cell_type": g.cell_type})
            cells[g.name].update(grade=True, points=float(g.max_score))
        for s in nb.solution_cells:
            cells.setdefault(s.name, {"locked": False, "grade": False})
            cells[s.name]["solution"] = True
        for t in nb.task_cells:
            cells.setdefault(t.name, {"locked": False, "grade": False, "solution": False})
            cells[t.name].update(task=True, points=float(t.max_score))
    return cells


def repair_cells(cells: list[Any], known: dict[str, dict[str, Any]]) -> list[str]:
    """Fix every cell's nbgrader metadata in place (phases 1-2); the repairs, in words."""
    notes: list[str] = []
    seen: set[str] = set()
    for index, cell in enumerate(cells):
        meta = cell.get("metadata", {}).get("nbgrader")
        if meta is None:
            continue
        gid = meta.get("grade_id") if isinstance(meta, dict) else None
        if isinstance(gid, str) and gid in known and gid not in seen:
            seen.add(gid)
            want = {**known[gid], "grade_id": gid, "schema_version": SCHEMA_VERSION}
            changed = sorted(k for k, v in want.items() if k != "cell_type" and (
                bool(meta.get(k)) != v if isinstance(v, bool) else meta.get(k) != v))
            if changed and changed != ["schema_version"] or meta.get("schema_version") not in (
                    None, 0, 1, 2, SCHEMA_VERSION):
                notes.append(f"cell {index} ({gid}): its nbgrader metadata ({', '.join(changed)}) "
                             "was not the assignment's; the assignment's was used")
            meta.update({k: v for k, v in want.items() if k != "cell_type"})
            if not meta.get("grade") and not meta.get("task"):
                meta.pop("points", None)
            continue
        flags = ("grade", "solution", "locked", "task")
        if isinstance(meta, dict) and not any(meta.get(k) for k in flags) \
                and meta.get("schema_version", SCHEMA_VERSION) == SCHEMA_VERSION:
            continue  # an ordinary cell nbgrader skips
        del cell["metadata"]["nbgrader"]
        why = ("a second cell with the same id" if gid in seen else
               "an id the assignment does not have" if isinstance(gid, str) else
               "nbgrader metadata that is not the assignment's")
        label = f" ({gid[:40]})" if isinstance(gid, str) else ""
        notes.append(f"cell {index}{label}: {why}; it was graded as an ordinary cell and earns "
                     "no points by itself")
    return notes


def note_cell(notes: list[str]) -> Any:
    """A markdown cell listing ``notes`` (escaped: they quote what the student wrote)."""
    lines = "\n".join(f"- {html.escape(n)}" for n in notes)
    return new_markdown_cell(f"{NOTE_TITLE}\n\n{lines}\n")


class RepairStudentMetadata(NbGraderPreprocessor):  # type: ignore[misc]
    """Make a submission's nbgrader metadata the assignment's before nbgrader validates it."""

    def preprocess(self, nb: Any, resources: Any) -> tuple[Any, Any]:
        _, escaped = escape_invalid_text(nb)
        notes = repair_cells(nb.cells, _gradebook_cells(resources["nbgrader"]))
        if escaped:
            notes.append(f"{escaped} piece(s) of text that are not valid Unicode were escaped")
        for note in notes:
            self.log.warning("labkit: %s", note)
        if notes:
            nb.cells.insert(0, note_cell(notes))
        return nb, resources
