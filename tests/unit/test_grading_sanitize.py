"""Issue 35, items 1 and 7 at the unit level: what a submission shows is made inert, its
nbgrader metadata is made the assignment's, invalid text is escaped, the reply pipe shrugs off
a newline flood, and the class loop gives a failed submission a zero and a reason.

The same cases graded through nbgrader end to end: ``tests/grading/test_grading_robust.py``.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from labkit.grading import classgrade
from labkit.grading.repair import repair_cells
from labkit.grading.sandbox.pipe import Pipe
from labkit.grading.sanitize import (
    SanitizeStudentContent,
    active_content,
    escape_invalid_text,
    rendered_active,
)

PAYLOADS = {
    "img onerror": '<img src=x onerror="alert(1)">',
    "script": "<script>alert(2)</script>",
    "javascript link": "[click](javascript:alert(3))",
    "entity-encoded link": "[click](jav&#x61;script&#58;alert(4))",
    "html javascript link": '<a href=" javascript:alert(5)">x</a>',
    "iframe": '<iframe src="https://example.com"></iframe>',
    "svg with script": "<svg><script>alert(6)</script></svg>",
    "event handler": '<div onmouseover="alert(7)">hover</div>',
    "object": '<object data="javascript:alert(8)"></object>',
}
HONEST = ["# Answer\n\nThe bubble is $(p-1)/(m+p-1)$, see [the paper](https://arxiv.org/abs/1811.06965).",
          "| a | b |\n|---|---|\n| 1 | 2 |\n\n**bold** and `code` and <b>html bold</b>",
          "![plot](data:image/png;base64,iVBORw0KGgo=)"]


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_each_payload_is_active_once_rendered(name: str) -> None:
    assert rendered_active(PAYLOADS[name]), name


@pytest.mark.parametrize("source", HONEST)
def test_honest_markdown_is_not_flagged(source: str) -> None:
    assert rendered_active(source) == []


def _sanitized(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    out, _ = SanitizeStudentContent().preprocess(nb, {})
    return out


def test_markdown_and_outputs_become_inert_and_honest_content_stays() -> None:
    """Every payload's cell becomes a note plus escaped text; active outputs are dropped or
    kept as plain text; honest cells and a score's text/plain are untouched."""
    cells = [new_markdown_cell(p) for p in PAYLOADS.values()] + [new_markdown_cell(h)
                                                                  for h in HONEST]
    code = new_code_cell("x")
    code.outputs = [
        new_output("display_data", data={"text/html": '<img src=x onerror="alert(9)">',
                                          "application/javascript": "alert(10)"}),
        new_output("display_data", data={"image/svg+xml": "<svg><script>alert(11)</script></svg>",
                                          "text/plain": "<svg>"}),
        new_output("display_data", data={"text/markdown": "[x](javascript:alert(12))"}),
        new_output("execute_result", data={"text/plain": "3.0"}, execution_count=1),
        new_output("display_data", data={"text/html": "<b>fine</b>", "text/plain": "fine"}),
    ]
    nb = _sanitized(new_notebook(cells=[*cells, code]))
    for cell in nb.cells[:len(PAYLOADS)]:
        assert "labkit removed active content" in cell.source
        assert rendered_active(cell.source) == []
    assert [c.source for c in nb.cells[len(PAYLOADS):-1]] == HONEST
    outs = nb.cells[-1].outputs
    assert outs[0].data == {"text/plain": '<img src=x onerror="alert(9)">'}
    assert outs[1].data == {"text/plain": "<svg>"}
    assert outs[2].data == {"text/plain": "[x](javascript:alert(12))"}
    assert outs[3].data == {"text/plain": "3.0"}
    assert outs[4].data == {"text/html": "<b>fine</b>", "text/plain": "fine"}


def test_svg_from_matplotlib_style_is_kept() -> None:
    svg = ('<svg xmlns:xlink="http://www.w3.org/1999/xlink"><defs><style>*{stroke:none}</style>'
           '</defs><use xlink:href="#p1"/></svg>')
    assert active_content(svg, svg=True) == []
    assert active_content(svg) != []  # as HTML inside a page it is an island: not allowed


def test_lone_surrogates_are_escaped_so_the_notebook_can_be_written(tmp_path: Path) -> None:
    nb = new_notebook(cells=[new_code_cell("print('\ud800')")])
    nb.cells[0].outputs = [new_output("stream", name="stdout", text="a\ud800b\udfff\n")]
    nb, changed = escape_invalid_text(nb)
    assert changed == 2
    assert nb.cells[0].outputs[0].text == "a\\ud800b\\udfff\n"
    nbformat.write(nb, tmp_path / "x.ipynb")  # raised UnicodeEncodeError before


KNOWN = {"answer": {"grade": False, "solution": True, "locked": False, "task": False,
                    "cell_type": "code"},
         "test": {"grade": True, "solution": False, "locked": True, "task": False,
                  "cell_type": "code", "points": 2.0}}


def _cell(meta: object) -> nbformat.NotebookNode:
    return new_code_cell("x = 1", metadata={"nbgrader": meta})


def test_metadata_is_made_the_assignments_and_strays_are_ignored_with_a_note() -> None:
    cells = [_cell({"grade_id": "answer", "solution": True, "grade": False, "locked": False,
                    "schema_version": 99}),
             _cell({"grade_id": "test", "grade": True, "locked": True, "solution": False,
                    "points": 50, "schema_version": 3}),
             _cell({"grade_id": "extra_points", "grade": True, "points": 5, "locked": True,
                    "solution": False, "schema_version": 3}),
             _cell({"grade_id": "test", "grade": True, "points": 2, "locked": True,
                    "solution": False, "schema_version": 3}),
             _cell("not a mapping"),
             _cell({"schema_version": 3, "grade": False, "solution": False, "locked": False})]
    notes = repair_cells(cells, KNOWN)
    assert cells[0].metadata.nbgrader["schema_version"] == 3
    assert cells[1].metadata.nbgrader["points"] == 2.0
    assert all("nbgrader" not in c.metadata for c in cells[2:5])
    assert "nbgrader" in cells[5].metadata  # an ordinary cell nbgrader skips
    text = "\n".join(notes)
    assert "cell 0 (answer)" in text and "schema_version" in text
    assert "cell 1 (test)" in text and "points" in text
    assert "cell 2 (extra_points): an id the assignment does not have" in text
    assert "cell 3 (test): a second cell with the same id" in text
    assert "cell 4: nbgrader metadata that is not the assignment's" in text
    assert len(notes) == 5


class _OsPipe(Pipe):
    def __init__(self) -> None:
        super().__init__()
        self._from, self._writer = os.pipe()

    def stop(self) -> None:
        pass

    def alive(self) -> bool:
        return True

    def stderr_tail(self) -> str:
        return ""


def test_a_newline_flood_on_the_reply_pipe_costs_the_grader_little_cpu() -> None:
    """1 MiB of newlines (then junk lines, then the reply): the old buffer re-copied the rest
    of the buffer per line, 21 s of the grader's CPU; now one split per chunk."""
    pipe = _OsPipe()
    flood = b"\n" * 2**20 + b"{not json}\n" * 10_000 + b'{"id": 1}\n'

    def write() -> None:
        view = memoryview(flood)
        while view:
            view = view[os.write(pipe._writer, view):]

    writer = threading.Thread(target=write)
    cpu = time.process_time()
    writer.start()
    try:
        assert pipe.receive(time.monotonic() + 30) == {"id": 1}
    finally:
        writer.join()
        os.close(pipe._writer)
        os.close(pipe._from)
    assert time.process_time() - cpu < 2.0


def test_the_class_loop_gives_a_failed_submission_a_zero_a_reason_and_grades_the_rest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nbgrader failing for bob (any way) leaves alice and carol graded; bob scores 0 with a
    feedback page that quotes the error, escaped."""
    for student in ("alice", "bob", "carol"):
        (tmp_path / "course" / "submitted" / student / "ps1").mkdir(parents=True)
    calls: list[list[str]] = []

    class Proc:
        def __init__(self, rc: int, err: str) -> None:
            self.returncode, self.stdout, self.stderr = rc, "", err

    def fake(args: list[str], root: Path, timeout: float = 0) -> Proc:
        calls.append(args)
        if args[3] == "bob" and args[0] == "autograde":
            return Proc(1, "[AutogradeApp | ERROR] <script>x</script> broke\n"
                           "[AutogradeApp | ERROR] There was an error processing assignment\n")
        return Proc(0, "")

    monkeypatch.setattr(classgrade.course, "nbgrader", fake)
    monkeypatch.setattr(classgrade, "_zero", lambda root, a, s: (14.0, ["ps1"]))
    monkeypatch.setattr(classgrade, "_total", lambda root, a, s: (14.0, 14.0))
    grades = {g.student: g for g in classgrade.grade_class("ps1", tmp_path)}
    assert [c[0] + " " + c[3] for c in calls] == [
        "autograde alice", "generate_feedback alice", "autograde bob", "autograde carol",
        "generate_feedback carol"]
    assert grades["alice"].score == grades["carol"].score == 14.0
    bob = grades["bob"]
    assert not bob.graded and bob.score == 0 and bob.error == "<script>x</script> broke"
    assert bob.line() == "bob: 0 / 14 (not graded: <script>x</script> broke)"
    page = bob.feedback[0].read_text() if bob.feedback else ""
    assert "score 0" in page and "&lt;script&gt;x&lt;/script&gt; broke" in page
    assert "<script>" not in page


def test_grading_a_class_counts_its_students_on_stderr_and_keeps_stdout_clean(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A class takes minutes: asked for progress off a terminal, each graded student is a
    line on stderr; unasked there, nothing; stdout never (the report is printed there)."""
    class Proc:
        returncode, stdout, stderr = 0, "", ""

    monkeypatch.setattr(classgrade.course, "nbgrader", lambda *a, **k: Proc())
    monkeypatch.setattr(classgrade, "_total", lambda root, a, s: (3.0, 4.0))
    classgrade.grade_class("ps1", tmp_path, ["alice", "bob"], progress=True)
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.splitlines() == ["grading ps1: 1/2 alice", "grading ps1: 2/2 bob"]
    classgrade.grade_class("ps1", tmp_path, ["alice", "bob"])
    assert capsys.readouterr() == ("", "")
