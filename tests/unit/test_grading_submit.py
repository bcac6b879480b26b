"""labkit submit's pieces that need no nbgrader run: CLI wiring, tamper detection, widget."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import nbformat
import pytest

from labkit.grading import cli as grading_cli
from labkit.grading.feedback import strip_hidden
from labkit.grading.submit import QuestionScore, SubmitResult, tampering

pytestmark = pytest.mark.lesson08
REPO = Path(__file__).resolve().parents[2]
RELEASE = REPO / "exercises" / "ps1_numbers" / "ps1_numbers.ipynb"


def test_cli_registers_submit_and_course() -> None:
    parser = argparse.ArgumentParser()
    grading_cli.register(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["submit", "ps1_numbers", "--student", "alice", "--json"])
    assert args.func is grading_cli._submit and args.student == "alice" and args.json
    assert parser.parse_args(["course", "check"]).func is grading_cli._check
    traces = parser.parse_args(["course", "traces", "--only", "public"])
    assert traces.func is grading_cli._traces and traces.only == "public"
    assert parser.parse_args(["submit", "ps1_numbers", "--cell-timeout", "5",
                              "--sandbox", "none"]).cell_timeout == 5


def test_submit_rejects_unknown_assignment_before_grading(capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    args = argparse.Namespace(assignment="ps9_nope", notebook=None, student="s", json=False)
    assert grading_cli._submit(args) == 2
    assert "ps1_numbers" in capsys.readouterr().err  # names a valid example


def test_tampering_detects_edited_and_deleted_locked_cells(tmp_path: Path) -> None:
    nb = nbformat.read(RELEASE, as_version=4)
    ids = [c.metadata["nbgrader"]["grade_id"] for c in nb.cells
           if c.metadata.get("nbgrader", {}).get("grade")]
    edited = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == ids[0])
    edited.source = "pass"
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") != ids[1]]
    path = tmp_path / "ps1_numbers.ipynb"
    nbformat.write(nb, path)
    found = " ".join(tampering(path, RELEASE))
    assert f"{ids[0]} was edited" in found and f"{ids[1]} was deleted" in found
    assert tampering(RELEASE, RELEASE) == []


def test_strip_hidden_keeps_visible_lines_only() -> None:
    src = "check(a)\n### BEGIN HIDDEN TESTS\nsecret(b)\n### END HIDDEN TESTS\nafter()"
    out, removed = strip_hidden(src)
    assert removed and "secret" not in out and "check(a)" in out and "after()" in out


def test_report_and_widget_render_scores_and_feedback_path() -> None:
    from labkit.widgets.submit import SubmitPanel, render

    result = SubmitResult("ps1_numbers", "s", [QuestionScore("q1", "nb", 1, 2),
                                               QuestionScore("q2", "nb", 3, 3)],
                          [Path("/tmp/fb.html")], ["locked cell q1 was edited"])
    text = result.report()
    assert "q1" in text and "4 / 5" in text and "feedback: /tmp/fb.html" in text
    html = render(result)
    assert "4 / 5" in html and "/tmp/fb.html" in html and "Tampering" in html
    panel = SubmitPanel("ps1_numbers")
    assert panel.button.description == "Submit for grading" and panel.result is None


def test_an_nbgrader_run_past_its_budget_is_a_lab_error_not_a_raw_timeout(monkeypatch,
                                                                           tmp_path: Path) -> None:
    """Issue 18: `labkit submit` used to die with subprocess.TimeoutExpired after 900 s."""
    import subprocess

    from labkit.base.errors import LabError
    from labkit.grading import course

    def too_slow(*args: object, **kwargs: object) -> None:
        raise subprocess.TimeoutExpired(cmd="nbgrader", timeout=5)

    monkeypatch.setattr(course.subprocess, "run", too_slow)
    with pytest.raises(LabError, match="nbgrader autograde did not finish within 5 s"):
        course.nbgrader(["autograde", "ps1_numbers"], tmp_path, timeout=5)


def test_a_notebook_may_be_called_anything_when_the_assignment_has_one(tmp_path: Path) -> None:
    """Issue 25: `labkit submit ps1_numbers --notebook "ps1 (1).ipynb"` grades it as the
    assignment's notebook; with several files each must be named after one of its notebooks."""
    from labkit.base.errors import ConfigError
    from labkit.grading.submit import _targets

    copy = tmp_path / "ps1 (1).ipynb"
    assert _targets("ps1_numbers", [copy], REPO / "exercises") == ["ps1_numbers.ipynb"]
    with pytest.raises(ConfigError, match=r"has the notebooks \['ps1_numbers.ipynb'\].*"
                                          r"--notebook ps1_numbers.ipynb"):
        _targets("ps1_numbers", [copy, tmp_path / "other.ipynb"], REPO / "exercises")


# ---- progress (issue 39, item 3): what is being graded, on stderr, never in --json ---------
def test_the_narrator_names_each_cell_as_nbgrader_starts_it_and_a_long_one_as_it_runs() -> None:
    """The executor's log lines become progress lines; 10 s without one says how long the
    current cell has run (the clock is a counter: no real waiting)."""
    from labkit.grading.submit_progress import Narrator

    now = [0.0]
    said: list[str] = []
    told = Narrator(said.append, quiet_s=10.0, clock=lambda: now[0])
    told.phase("ps1: grading", doing="in nbgrader autograde")
    told.line("[AutogradeApp | INFO] grading ps1.ipynb in a 'bwrap' sandbox, limits held by "
              "rlimits")
    told.line("[AutogradeApp | INFO] grading cell 1 of 3 (-, box)")
    told.line("[AutogradeApp | INFO] cell 1 (-, box): 0.20 s")  # quick: no line of its own
    told.line("[AutogradeApp | INFO] grading cell 2 of 3 (q1_ring, box)")
    told.line("[AutogradeApp | INFO] grading cell 3 of 3 (q1_ring_test, test)")
    now[0] = 9.0
    told.tick()  # said something 9 s ago: nothing yet
    now[0] = 12.0
    told.tick()
    told.line("[AutogradeApp | INFO] cell 3 (q1_ring_test, test): 14.50 s")
    assert said == ["ps1: grading", "  running ps1.ipynb in a 'bwrap' sandbox",
                    "  cell 1/3: (your code, in the sandbox)",
                    "  cell 2/3: q1_ring (your code, in the sandbox)",
                    "  cell 3/3: q1_ring_test (its tests, run by the grader)",
                    "  ... still on cell 3/3 (q1_ring_test): 12 s", "  cell 3 took 14 s"]


@pytest.fixture
def fake_nbgrader(monkeypatch, tmp_path: Path):
    """A student's copy of ps1_numbers in tmp_path, and an nbgrader that logs two cells."""
    import shutil
    import subprocess

    from labkit.grading import course
    from labkit.grading import submit as submit_module

    shutil.copytree(REPO / "exercises" / "ps1_numbers", tmp_path / "exercises" / "ps1_numbers")
    monkeypatch.setenv("LABKIT_COURSE_ROOT", str(tmp_path))
    monkeypatch.setattr(submit_module, "_in_gradebook", lambda root, assignment: True)
    monkeypatch.setattr(submit_module, "_scores",
                        lambda root, a, s: [QuestionScore("q1", "ps1_numbers", 1.0, 2.0)])
    calls: list[str] = []

    def nbgrader(args, root, env=None, timeout=900, on_line=None):
        calls.append(args[0])
        log = ["grading cell 1 of 2 (q1, box)", "cell 1 (q1, box): 0.10 s",
               "grading cell 2 of 2 (q1_test, test)", "cell 2 (q1_test, test): 0.20 s"]
        for line in log if args[0] == "autograde" and on_line else []:
            on_line(f"[AutogradeApp | INFO] {line}")
        return subprocess.CompletedProcess(args, 0, "", "\n".join(log))

    monkeypatch.setattr(course, "nbgrader", nbgrader)
    return calls


def test_labkit_submit_shows_each_cell_on_stderr_and_keeps_json_clean(fake_nbgrader, capsys
                                                                      ) -> None:
    args = argparse.Namespace(assignment="ps1_numbers", notebook=None, student="s", json=True)
    assert grading_cli._submit(args) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["score"] == 1.0  # stdout: one JSON object, nothing else
    assert fake_nbgrader == ["autograde", "generate_feedback"]
    assert "ps1_numbers: grading ps1_numbers.ipynb as s: nbgrader autograde runs" in err
    assert "  cell 1/2: q1 (your code, in the sandbox)" in err
    assert "  cell 2/2: q1_test (its tests, run by the grader)" in err
    assert "nbgrader generate_feedback" in err


def test_submit_without_a_listener_says_nothing(fake_nbgrader, capsys) -> None:
    """The library call (a test, the instructor's scripts) prints nothing of its own."""
    from labkit.grading.submit import submit

    assert submit("ps1_numbers", student="s").score == 1.0
    assert capsys.readouterr() == ("", "")
