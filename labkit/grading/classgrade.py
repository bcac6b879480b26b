"""``labkit course grade ASSIGNMENT``: grade a whole class, one submission never stopping the rest.

``nbgrader autograde ASSIGNMENT`` grades every student in one process: an error it treats
as fatal (a notebook claiming a newer metadata schema, a database error) stops it for every
student sorted after the one who caused it, and a notebook that fails is left with no score
and no feedback. Here each submission is graded on its own:

1. ``nbgrader autograde ASSIGNMENT --student S`` in a process of its own, per student
   (labkit's repair and sanitizing preprocessors already turn the known bad notebooks into
   gradable ones, with a note);
2. a submission that still fails gets a score of 0 in the gradebook and a feedback page
   that says why, in words (the last error nbgrader logged);
3. ``nbgrader generate_feedback`` per student, for those that graded;
4. a report line per student: score, or the reason it is 0.

A class takes minutes: one bar counts the students graded (``labkit.base.progress.each``:
on stderr, on a terminal or in a notebook, never in the report on stdout).
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from pathlib import Path

from labkit.base.errors import LabError
from labkit.base.progress import each
from labkit.grading import course

_ERROR = re.compile(r"\[\w+ \| ERROR\] (.*)")
_BORING = ("There was an error processing assignment", "Please see the")


@dataclass
class StudentGrade:
    """One student's outcome: a score, or 0 with the reason grading failed."""

    student: str
    score: float
    max_score: float
    error: str = ""
    """Why the submission scored 0 without being graded, or why it has no feedback."""
    feedback: list[Path] | None = None
    graded: bool = True

    def line(self) -> str:
        head = f"{self.student}: {self.score:g} / {self.max_score:g}"
        if not self.graded:
            return f"{head} (not graded: {self.error})"
        return head + (f" ({self.error})" if self.error else "")


def reason(log: str) -> str:
    """The error nbgrader logged last, in one line (its boilerplate lines skipped)."""
    errors = [m.strip() for m in _ERROR.findall(log) if m.strip() and not m.startswith(_BORING)]
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    if errors:
        return errors[-1][:300]
    exc = [ln for ln in lines if re.match(r"\w*(Error|Exception)\b", ln)]
    return (exc or lines or ["nbgrader failed without saying why"])[-1][:300]


def _zero(root: Path, assignment: str, student: str) -> tuple[float, list[str]]:
    """Give ``student`` 0 on every graded cell of ``assignment``; its max score and notebooks."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{root / 'course' / 'gradebook.db'}") as gb:
        gb.update_or_create_student(student)
        sub = gb.update_or_create_submission(assignment, student)
        for nb in sub.notebooks:
            for grade in nb.grades:
                grade.auto_score = 0
                grade.manual_score = None
                grade.needs_manual_grade = False
        gb.db.commit()
        return float(sub.max_score), sorted(nb.name for nb in sub.notebooks)


def _total(root: Path, assignment: str, student: str) -> tuple[float, float]:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{root / 'course' / 'gradebook.db'}") as gb:
        sub = gb.find_submission(assignment, student)
        return float(sub.score), float(sub.max_score)


def failed_feedback(root: Path, assignment: str, student: str, why: str,
                    notebooks: list[str]) -> list[Path]:
    """Feedback pages saying the submission scored 0 and why (the text is escaped)."""
    folder = root / "course" / "feedback" / student / assignment
    folder.mkdir(parents=True, exist_ok=True)
    page = ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>{nb}</title></head><body>"
            f"<h1>{html.escape(assignment)}: not graded, score 0</h1>"
            "<p>Your submission could not be graded, so it scores 0. The grader said:</p>"
            f"<pre>{html.escape(why)}</pre><p>Fix the notebook (or ask your instructor) "
            "and submit again.</p></body></html>")
    out = []
    for name in notebooks or [assignment]:
        path = folder / f"{name}.html"
        path.write_text(page.replace("{nb}", html.escape(name)))
        out.append(path)
    return out


def _run(args: list[str], root: Path, timeout: float) -> tuple[bool, str]:
    try:
        proc = course.nbgrader(args, root, timeout=timeout)
    except LabError as exc:
        return False, str(exc)
    return proc.returncode == 0, proc.stdout + proc.stderr


def students(root: Path, assignment: str) -> list[str]:
    """Students with a submission of ``assignment`` in ``course/submitted/``."""
    base = root / "course" / "submitted"
    return sorted(p.name for p in base.iterdir() if (p / assignment).is_dir()) \
        if base.is_dir() else []


def grade_class(assignment: str, root: Path | None = None, names: list[str] | None = None,
                timeout: float = 3600, progress: bool | None = None) -> list[StudentGrade]:
    """Autograde and give feedback to every submission of ``assignment``, each on its own;
    ``progress`` (``labkit.base.progress``'s rule): one bar over the students."""
    root = root or course.repo_root()
    out = []
    for student in each(names or students(root, assignment), f"grading {assignment}",
                        unit="student", progress=progress):
        # 1. autograde this student alone
        ok, log = _run(["autograde", assignment, "--student", student, "--force"], root, timeout)
        if not ok:
            # 2. a zero and a page that says why
            why = reason(log)
            max_score, notebooks = _zero(root, assignment, student)
            out.append(StudentGrade(student, 0.0, max_score, why,
                                    failed_feedback(root, assignment, student, why, notebooks),
                                    graded=False))
            continue
        # 3. feedback for this student alone
        ok, log = _run(["generate_feedback", assignment, "--student", student, "--force"],
                       root, timeout)
        score, max_score = _total(root, assignment, student)
        folder = root / "course" / "feedback" / student / assignment
        out.append(StudentGrade(student, score, max_score,
                                "" if ok else f"no feedback: {reason(log)}",
                                sorted(folder.glob("*.html"))))
    return out
