"""Keys out of a student's reach: where the class's answer keys are, and who can read them.

A class's secrets are the answer keys and hidden inputs (``solutions/_grading/*.py``), the
solution notebooks (``solutions/<ps>/``), the course secret that seeds each student's hidden
inputs, and the gradebook. ``labkit course hub`` copies them into the instructor's course
folder (mode 700) and writes a fresh course secret there, which the grader uses in place of
the one committed in the source (:func:`labkit.grading.instructor.load`). The grader reads
them only from there (nbgrader's ``CourseDirectory.root``).

But labkit itself may run from a checkout (``pip install -e``, the documented install, or a
``PYTHONPATH``): that checkout holds ``solutions/`` too, and every student's kernel can find
it from ``labkit.__file__`` (issue 35, item 3). So the set-up

1. finds every checkout labkit is imported from (the package's own, each ``--pythonpath``);
2. closes its ``solutions/`` (mode 700; the owner keeps it, so a developer's copy works);
3. checks, *as a student* (``runuser``), which secret files that student can read, in the
   checkouts (their git history included) and in the course, and reports each one found,
   instead of assuming. The history of a checkout is reported, not changed: it is the
   administrator's (``chmod -R go-rwx`` it, or install labkit from a wheel, which carries
   no ``solutions/``).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path

from labkit.grading.instructor import SECRET_FILE

_CHECK = 'for p do [ -r "$p" ] && printf "%s\\n" "$p"; done; exit 0'


def checkouts(pythonpath: str = "") -> list[Path]:
    """Folders labkit runs from that hold a ``solutions/`` (the package's checkout, and each
    entry of ``pythonpath``)."""
    found = [Path(__file__).resolve().parents[2],  # .../labkit/grading/keys.py
             *(Path(p).resolve() for p in pythonpath.split(os.pathsep) if p)]
    return sorted({p for p in found if (p / "solutions").is_dir()})


def git_dir(checkout: Path) -> Path | None:
    """The folder holding the checkout's history (a worktree's ``.git`` file points to it)."""
    dot = checkout / ".git"
    if dot.is_dir():
        return dot
    if dot.is_file():
        text = dot.read_text(errors="replace").strip()
        if text.startswith("gitdir:"):
            worktree = (checkout / text.split(":", 1)[1].strip()).resolve()
            common = worktree / "commondir"
            return (worktree / common.read_text().strip()).resolve() if common.is_file() \
                else worktree
    return None


def secret_files(folder: Path) -> list[Path]:
    """What must stay the instructor's in a checkout or course folder."""
    sol = folder / "solutions"
    out = [*sorted((sol / "_grading").glob("*.py")), sol / "_grading" / SECRET_FILE,
           *sorted(sol.glob("*/*.ipynb")), folder / "course" / "gradebook.db"]
    git = git_dir(folder)
    if git is not None:
        out.append(git / "objects")  # readable objects: every solution ever committed
    return [p for p in out if p.exists()]


def close_checkout(checkout: Path) -> list[str]:
    """Take ``solutions/`` of a checkout away from everyone but its owner."""
    sol = checkout / "solutions"
    os.chmod(sol, 0o700)
    return [f"keys: {sol} closed (mode 700, owner only): labkit runs from this checkout"]


def readable_by(user: str, paths: list[Path]) -> list[Path]:
    """Which of ``paths`` ``user`` can read, asked as that user (``runuser ... test -r``)."""
    if not paths:
        return []
    runuser = shutil.which("runuser", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    proc = subprocess.run([runuser or "runuser", "-u", user, "--", "/bin/sh", "-c", _CHECK,
                           "sh", *map(str, paths)], capture_output=True, text=True,
                          timeout=60, check=False, cwd="/", env={"PATH": "/usr/bin:/bin"})
    if proc.returncode != 0:
        return list(paths)  # could not ask: assume the worst, say so
    return [Path(line) for line in proc.stdout.splitlines() if line]


def write_course_secret(grading: Path, uid: int, gid: int) -> None:
    """A fresh course secret in ``grading/`` (kept when there is one), the instructor's only."""
    path = grading / SECRET_FILE
    if not path.exists():
        path.write_text(secrets.token_hex(16) + "\n")
    os.chown(path, uid, gid)
    os.chmod(path, 0o600)


def audit(student: str, course: Path, folders: list[Path]) -> list[str]:
    """Close the ``solutions/`` of each checkout in ``folders`` (:func:`checkouts`), then
    report what ``student`` can still read there and in the ``course`` folder."""
    lines: list[str] = []
    for checkout in folders:
        lines += close_checkout(checkout)
    files = [p for folder in (course, *folders) for p in secret_files(folder)]
    open_ = readable_by(student, files)
    if not open_:
        lines.append(f"protected: answer keys, solutions, the course secret and the gradebook "
                     f"({len(files)} files checked as {student}, none readable)")
    for path in open_:
        what = "history (every committed solution)" if path.name == "objects" else "file"
        lines.append(f"NOT protected: {student} can read {path} ({what}); "
                     f"chmod -R go-rwx {path.parent if what != 'file' else path}")
    return lines
