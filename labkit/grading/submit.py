"""``labkit submit ASSIGNMENT``: grade your own notebook locally, the way the instructor will.

The notebook runs in the same sandbox as the instructor's autograding
(``labkit.grading.sandbox``): student cells in a box, checks outside it, a per-cell time
limit. Where the checkout has no ``solutions/<assignment>`` (a student's copy), the
release itself is the source: the visible tests run, the hidden ones cannot (the report
says so), and the score is a practice score.

Phases (nbgrader's instructor workflow, run for one student on one machine):
  1. make sure the gradebook knows the assignment (``generate_assignment`` into
     ``course/release``, so the committed ``exercises/`` is never touched);
  2. copy the student's notebook(s) into ``course/submitted/<student>/<assignment>/``
     with a timestamp;
  3. ``nbgrader autograde``: a fresh kernel runs the notebook with the locked test cells
     restored from the gradebook (edited or deleted test cells are caught by nbgrader's
     checksums and reported here as tampering), hidden tests included; code exercises
     start their own rank processes, which the supervisor always reaps;
  4. ``nbgrader generate_feedback``: HTML without hidden test source;
  5. read the score of every graded cell from the gradebook.
"""

from __future__ import annotations

import contextlib
import datetime
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.base.errors import ConfigError, LabError
from labkit.base.validate import real_problem
from labkit.grading import course
from labkit.grading.submit_progress import Narrator

MAX_CELL_TIMEOUT_S = 24 * 3600.0
"""Longest limit a graded cell may be given: a day (nbgrader's own default is 60 s)."""

_MISSING = re.compile(r"Missing grade cell (\S+)")
_SANDBOX = re.compile(r"in a '(\w+)' sandbox")


def _stopped_cells(folder: Path) -> list[str]:
    """Cells of the autograded notebooks whose output is a CellTimeout."""
    import nbformat

    out = []
    for path in sorted(folder.glob("*.ipynb")):
        for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
            if any(o.get("ename") == "CellTimeout" for o in cell.get("outputs", [])):
                gid = cell.metadata.get("nbgrader", {}).get("grade_id")
                out.append(f"{path.stem} cell {i}" + (f" ({gid})" if gid else ""))
    return out


@dataclass
class QuestionScore:
    grade_id: str
    notebook: str
    score: float
    max_score: float


@dataclass
class SubmitResult:
    """What ``submit`` did: scores per graded cell, feedback files, tampering found."""

    assignment: str
    student: str
    questions: list[QuestionScore]
    feedback_html: list[Path]
    tampered: list[str] = field(default_factory=list)
    log: str = ""
    sandbox: str = ""
    """The sandbox the notebook ran in (bwrap, unshare or none)."""
    stopped: list[str] = field(default_factory=list)
    """Cells stopped at the time limit (the rest of the notebook was still graded)."""
    practice: bool = False
    """Graded without solutions/: visible tests only."""

    @property
    def score(self) -> float:
        return sum(q.score for q in self.questions)

    @property
    def max_score(self) -> float:
        return sum(q.max_score for q in self.questions)

    def report(self) -> str:
        """The text ``labkit submit`` prints."""
        lines = [f"{self.assignment} for {self.student}:"]
        width = max((len(q.grade_id) for q in self.questions), default=8)
        for q in self.questions:
            lines.append(f"  {q.grade_id:<{width}}  {q.score:g} / {q.max_score:g}")
        lines.append(f"  {'total':<{width}}  {self.score:g} / {self.max_score:g}")
        for t in self.tampered:
            lines.append(f"  tampering: {t}")
        for cell in self.stopped:
            lines.append(f"  stopped at the time limit: {cell}")
        if self.sandbox:
            lines.append(f"  graded in a '{self.sandbox}' sandbox")
        if self.practice:
            lines.append("  practice score: this copy has no solutions/, so the hidden tests "
                         "did not run; the instructor's grading adds them")
        for path in self.feedback_html:
            lines.append(f"feedback: {path}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"assignment": self.assignment, "student": self.student, "score": self.score,
                "max_score": self.max_score, "tampered": self.tampered,
                "sandbox": self.sandbox, "stopped": self.stopped, "practice": self.practice,
                "questions": [q.__dict__ for q in self.questions],
                "feedback": [str(p) for p in self.feedback_html]}


def _locked_sources(path: Path) -> dict[str, str]:
    """grade_id -> source (hidden-test regions removed) of every locked cell."""
    import nbformat

    from labkit.grading.feedback import strip_hidden

    out = {}
    for cell in nbformat.read(path, as_version=4).cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("locked") and meta.get("grade_id"):
            source, _ = strip_hidden(cell.source)
            out[meta["grade_id"]] = "\n".join(
                line for line in source.split("\n") if "hidden tests ran here" not in line).strip()
    return out


def tampering(submitted: Path, released: Path) -> list[str]:
    """Locked cells of the release that the submission deleted or edited.

    nbgrader restores them while grading (its checksums catch the edit; OverwriteCells puts
    the original back), so tampering never earns points; this names it for the student.
    Hidden tests are not part of the comparison (the release does not have them).
    """
    if not released.exists():
        return []
    want, have = _locked_sources(released), _locked_sources(submitted)
    found = []
    for gid, source in want.items():
        if gid not in have:
            found.append(f"locked cell {gid} was deleted; nbgrader put it back and ran it")
        elif have[gid] != source:
            found.append(f"locked cell {gid} was edited; the original was graded instead")
    return found


def _targets(assignment: str, paths: list[Path], source: Path) -> list[str]:
    """The name each submitted file must have in the course (nbgrader grades by name).

    A student's copy may be called anything (``ps1 (1).ipynb``, ``mine.ipynb``): with one
    notebook in the assignment, it is that notebook; with several, each file must be
    named after one of them.
    """
    expected = sorted(p.name for p in (source / assignment).glob("*.ipynb"))
    if len(expected) == 1 and len(paths) == 1:
        return expected
    wrong = [p.name for p in paths if p.name not in expected]
    if wrong or len({p.name for p in paths}) != len(paths):
        raise ConfigError(f"notebook(s) {wrong or [p.name for p in paths]}: assignment "
                          f"{assignment} has the notebooks {expected}; name each file after "
                          f"one of them, e.g. --notebook {expected[0] if expected else 'x.ipynb'}")
    return [p.name for p in paths]


def _in_gradebook(root: Path, assignment: str) -> bool:
    db = root / "course" / "gradebook.db"
    if not db.exists():
        return False
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(f"sqlite:///{db}") as gb:
        try:
            gb.find_assignment(assignment)
            return True
        except MissingEntry:
            return False


def _scores(root: Path, assignment: str, student: str) -> list[QuestionScore]:
    from nbgrader.api import Gradebook

    out = []
    with Gradebook(f"sqlite:///{root / 'course' / 'gradebook.db'}") as gb:
        sub = gb.find_submission(assignment, student)
        for nb in sorted(sub.notebooks, key=lambda n: n.name):
            for grade in nb.grades:
                out.append(QuestionScore(grade.name, nb.name, float(grade.score),
                                         float(grade.max_score)))
    return out


def submit(assignment: str, notebooks: list[str | Path] | None = None, *,
           student: str = "student", root: Path | None = None,
           cell_timeout: float | None = None, test_timeout: float | None = None,
           sandbox: str | None = None, options: Mapping[str, object] | None = None,
           on_progress: Callable[[str], None] | None = None) -> SubmitResult:
    """Grade ``notebooks`` (default: ``exercises/<assignment>/*.ipynb``) as ``student``.

    ``cell_timeout`` / ``test_timeout`` / ``sandbox`` and ``options`` (any other
    ``SandboxedExecute`` setting, e.g. ``{"memory_mb": 1024}``) override
    ``nbgrader_config.py`` for this run. ``on_progress`` hears a line per phase, per cell
    as nbgrader grades it, and every 10 s of a long one (``labkit.grading.submit_progress``).
    """
    # 0. limits first, before nbgrader starts: nan, 0 and -1 are not "no timeout"
    limits = [real_problem(name, value, MAX_CELL_TIMEOUT_S, unit=" seconds", example=60,
                           why=f" (--{name.replace('_', '-')} S: a cell running longer is stopped)")
              for name, value in (("cell_timeout", cell_timeout), ("test_timeout", test_timeout))
              if value is not None]
    if any(limits):
        raise ConfigError([p for p in limits if p is not None])
    root = root or course.repo_root()
    course.check_assignment(assignment, root)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", student):
        raise ConfigError(f"student ({student!r}) must be letters, digits, '_', '-' or '.'; "
                          "e.g. student='alice'")
    paths = [Path(p) for p in notebooks] if notebooks else sorted(
        (root / "exercises" / assignment).glob("*.ipynb"))
    missing = [str(p) for p in paths if not p.is_file()]
    if missing or not paths:
        raise ConfigError(f"notebook(s) {missing or paths} not found; pass the path of your "
                          f"notebook, e.g. labkit submit {assignment} --notebook "
                          f"exercises/{assignment}/{assignment}.ipynb")
    practice = not (root / "solutions" / assignment).is_dir()
    targets = _targets(assignment, paths, root / ("exercises" if practice else "solutions"))
    opts = ["--CourseDirectory.source_directory=exercises"] if practice else []
    for name, value in (("cell_timeout", cell_timeout), ("test_timeout", test_timeout),
                        ("sandbox", sandbox), *(options or {}).items()):
        if value is not None:
            opts.append(f"--SandboxedExecute.{name}={value}")
    told = Narrator(on_progress or (lambda line: None))
    # 1. the gradebook must know the assignment's cells and checksums
    if not _in_gradebook(root, assignment):
        told.phase(f"{assignment}: adding the assignment to the gradebook (nbgrader "
                   f"generate_assignment)", doing="adding it to the gradebook")
        with told.ticking() if on_progress else contextlib.nullcontext():
            course.release(root, [assignment], release_dir=str(Path("course") / "release"),
                           source_dir="exercises" if practice else None)
    # 2. copy into the submitted folder, with a timestamp
    dest = root / "course" / "submitted" / student / assignment
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    tampered: list[str] = []
    cells = 0
    for p, name in zip(paths, targets):
        shutil.copy(p, dest / name)
        tampered += tampering(p, root / "exercises" / assignment / name)
        cells += p.read_text(errors="replace").count('"cell_type": "code"')
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f %Z")
    (dest / "timestamp.txt").write_text(stamp)
    # 3. autograde, 4. feedback; every cell has its own limit, this only guards nbgrader
    budget = 600 + min(cells, 300) * max(cell_timeout or 60, test_timeout or 120)
    log = ""
    phases = {"autograde": f"grading {', '.join(targets)} as {student}: nbgrader autograde runs "
                           f"it in a fresh kernel, cell by cell"
                           + (" (visible tests only)" if practice else ", hidden tests included"),
              "generate_feedback": "writing the feedback HTML (nbgrader generate_feedback)"}
    for args in (["autograde", assignment, "--student", student, "--create", "--force", *opts],
                 ["generate_feedback", assignment, "--student", student, "--force", *opts]):
        told.phase(f"{assignment}: {phases[args[0]]}", doing=f"in nbgrader {args[0]}")
        with told.ticking() if on_progress else contextlib.nullcontext():
            proc = course.nbgrader(args, root, timeout=budget,
                                   on_line=told.line if on_progress else None)
        log += proc.stdout + proc.stderr
        if proc.returncode != 0:
            raise LabError(f"nbgrader {args[0]} failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    feedback_dir = root / "course" / "feedback" / student / assignment
    html = sorted(feedback_dir.glob("*.html"))
    # 5. scores
    tampered += [f"test cell {gid} was missing; nbgrader put it back"
                 for gid in _MISSING.findall(log) if not any(gid in t for t in tampered)]
    mode = _SANDBOX.search(log)
    return SubmitResult(assignment, student, _scores(root, assignment, student), html,
                        tampered, log, sandbox=mode.group(1) if mode else "",
                        stopped=_stopped_cells(root / "course" / "autograded" / student /
                                               assignment),
                        practice=practice)
