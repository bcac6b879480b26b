"""Issue 35, items 1 and 7, through nbgrader for real: a submission can neither plant script in
the instructor's formgrader or the student's feedback, nor stop the class's grading.

Item 1: a ps1 submission whose markdown carries every kind of active content (event
handlers, script, ``javascript:`` links plain and entity-encoded, a frame, SVG with script,
an object) is graded by ``labkit submit``'s flow; the autograded notebook (what the
formgrader renders) and the feedback page hold none of it, rendered by the formgrader's own
template with nbconvert's defaults, and the honest answers still score full marks. Active
*outputs* cannot come out of the box (it returns text only), so they are planted in a stored
autograded notebook, as an older autograde would have left them, and ``generate_feedback``
must drop them.

Item 7: ``labkit course grade`` over a class where one notebook is not a notebook at all
(sorted first), one claims ``schema_version: 99``, one has a stray extra grade cell and one
prints a lone surrogate: every honest answer is graded, the broken one scores 0 with a
feedback page saying why, and the repaired ones say what was ignored.
"""

from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest
from nbconvert.exporters import HTMLExporter
from nbformat.v4 import new_code_cell, new_markdown_cell, new_output

from labkit.grading import course
from labkit.grading.classgrade import grade_class
from tests.grading.test_nbgrader_flow import grade, notebook, root, scores

pytestmark = [pytest.mark.grading, pytest.mark.lesson08]
__all__ = ["root"]  # the session's course copy, shared with the flow tests

MARK = "LKX"
PAYLOADS = [
    f'<img src=x onerror="alert(\'{MARK}1\')">',
    f"<script>alert('{MARK}2')</script>",
    f"[click me](javascript:alert('{MARK}3'))",
    f"[click me too](jav&#x61;script&#58;alert('{MARK}4'))",
    f'<iframe src="https://{MARK}5.example/"></iframe>',
    f"<svg><script>alert('{MARK}6')</script><circle onload=\"alert('{MARK}7')\"/></svg>",
    f'<div onmouseover="alert(\'{MARK}8\')">hover</div>',
    f'<object data="javascript:alert(\'{MARK}9\')"></object>',
    f'<a href="data:text/html,<script>alert(\'{MARK}10\')</script>">x</a>',
]
ACTIVE_OUTPUTS = {
    "text/html": f'<img src=x onerror="alert(\'{MARK}11\')">',
    "application/javascript": f"alert('{MARK}12')",
    "image/svg+xml": f"<svg><script>alert('{MARK}13')</script></svg>",
    "text/markdown": f"[x](javascript:alert('{MARK}14'))",
}


class _Live(HTMLParser):
    """Where a marker sits in a page other than as text: inside a tag, a script or a style."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.live: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in = tag if tag in ("script", "style") else None
        for name, value in attrs:
            if MARK in name or MARK in (value or ""):
                self.live.append(f"<{tag} {name}={value!r}>")

    def handle_data(self, data: str) -> None:
        if self._in and MARK in data:
            self.live.append(f"<{self._in}>{data[:80]}")

    def handle_endtag(self, tag: str) -> None:
        self._in = None


def live_markers(page: str) -> list[str]:
    parser = _Live()
    parser.feed(page)
    return parser.live


def formgrader_view(path: Path) -> str:
    """The autograded notebook as nbgrader's formgrader renders it, nbconvert's defaults (no
    sanitize_html): what the stored notebook holds is all that protects the instructor."""
    from nbgrader.server_extensions.formgrader import handlers

    exporter = HTMLExporter(template_name="formgrade",
                            extra_template_basedirs=[handlers.template_path])
    resources = {"assignment_id": "ps1_numbers", "notebook_id": "ps1_numbers",
                 "submission_id": "x", "index": 0, "total": 1, "base_url": "",
                 "student": "x", "last_name": None, "first_name": None,
                 "notebook_path": str(path)}
    page, _ = exporter.from_filename(str(path), resources=resources)
    return page


def test_active_content_reaches_neither_the_formgrader_nor_the_feedback(root: Path,
                                                                        tmp_path: Path) -> None:
    nb = notebook(root, "solutions", "ps1_numbers")
    nb.cells += [new_markdown_cell(p) for p in PAYLOADS]
    result = grade(root, "ps1_numbers", nb, "xss", tmp_path)
    assert result.score == result.max_score, result.report()  # the honest answers
    autograded = root / "course" / "autograded" / "xss" / "ps1_numbers" / "ps1_numbers.ipynb"
    stored = nbformat.read(autograded, as_version=4)
    assert sum("labkit removed active content" in c.source for c in stored.cells) == len(PAYLOADS)
    assert live_markers(formgrader_view(autograded)) == []
    page = result.feedback_html[0].read_text()
    assert live_markers(page) == []
    assert page.count("labkit removed active content") == len(PAYLOADS)
    assert html.escape("<img src=x onerror=") in page  # shown to the reader as text

    # 2. outputs an older autograde left in the stored notebook: feedback drops them
    graded = nbformat.read(autograded, as_version=4)
    cell = new_code_cell("print(1)")
    cell.outputs = [new_output("display_data", data=dict(ACTIVE_OUTPUTS))]
    graded.cells.append(cell)
    graded.cells.append(new_markdown_cell(PAYLOADS[0]))
    nbformat.write(graded, autograded)
    assert live_markers(formgrader_view(autograded)) != []  # the check can see them
    proc = course.nbgrader(["generate_feedback", "ps1_numbers", "--student", "xss", "--force"],
                           root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert live_markers(result.feedback_html[0].read_text()) == []


def _submit_raw(root: Path, student: str, text: str) -> None:
    folder = root / "course" / "submitted" / student / "ps1_numbers"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ps1_numbers.ipynb").write_text(text)
    (folder / "timestamp.txt").write_text("2024-01-01 00:00:00.000000 UTC")


def _with_cell_meta(nb: nbformat.NotebookNode, grade_id: str, **meta: object) -> None:
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            cell.metadata["nbgrader"].update(meta)
            return
    raise KeyError(grade_id)


def test_one_bad_submission_never_stops_the_class(root: Path) -> None:
    course.release(root, ["ps1_numbers"], release_dir=str(Path("course") / "release"))
    honest = notebook(root, "solutions", "ps1_numbers")
    _submit_raw(root, "c1_broken", '{"cells": [ this is not a notebook')
    schema = notebook(root, "solutions", "ps1_numbers")
    _with_cell_meta(schema, "bubble_answer", schema_version=99)
    _submit_raw(root, "c2_schema", nbformat.writes(schema))
    stray = notebook(root, "solutions", "ps1_numbers")
    stray.cells.append(new_code_cell("print('free points')", metadata={"nbgrader": {
        "grade": True, "grade_id": "extra_points", "locked": True, "points": 5,
        "schema_version": 3, "solution": False, "task": False}}))
    _submit_raw(root, "c3_stray", nbformat.writes(stray))
    surrogate = notebook(root, "solutions", "ps1_numbers")
    surrogate.cells.append(new_code_cell("print('\\ud800')"))
    surrogate.cells[-1].outputs = [new_output("stream", name="stdout", text="\ud800\n")]
    _submit_raw(root, "c4_surrogate", json.dumps(surrogate, ensure_ascii=True))
    _submit_raw(root, "c5_honest", nbformat.writes(honest))

    names = ["c1_broken", "c2_schema", "c3_stray", "c4_surrogate", "c5_honest"]
    grades = {g.student: g for g in grade_class("ps1_numbers", root, names)}
    report = "\n".join(g.line() for g in grades.values())
    broken = grades.pop("c1_broken")
    assert not broken.graded and broken.score == 0 and broken.max_score > 0, report
    assert broken.error and broken.feedback, report
    assert "could not be graded" in broken.feedback[0].read_text()
    for student, g in grades.items():
        assert g.graded and g.error == "" and g.score == g.max_score > 0, report
        assert g.feedback and g.feedback[0].exists(), student
    text = {s: re.sub(r"<[^>]+>", "", g.feedback[0].read_text())  # type: ignore[index]
            for s, g in grades.items()}
    assert "cell" in text["c2_schema"] and "schema_version" in text["c2_schema"]
    assert "extra_points): an id the assignment does not have" in text["c3_stray"]
    assert "\\ud800" in text["c4_surrogate"]
    assert "were ignored" not in text["c5_honest"]
    got = scores(grade(root, "ps1_numbers", honest, "after", root / "tmp-after"))
    assert all(v > 0 for v in got.values())  # the course still grades afterwards
