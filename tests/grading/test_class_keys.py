"""Keys out of a student's reach (issue 35, item 3), checked as a student, without a hub.

A checkout labkit runs from (an editable install) holds ``solutions/``: before the set-up a
student (``nobody`` here) reads its answer keys; ``keys.audit`` closes it, asks again as
that student, and reports what is still open (the checkout's git history) instead of
claiming everything is protected. The grader still finds the keys in the course folder, and
a class's own course secret replaces the one committed in the source. Needs root (runuser).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from labkit.grading import instructor, keys

pytestmark = [pytest.mark.lesson08,
              pytest.mark.skipif(os.geteuid() != 0 or shutil.which(
                  "runuser", path="/usr/sbin:/sbin:/usr/bin:/bin") is None,
                  reason="asks as another user: root and runuser")]
REPO = Path(__file__).resolve().parents[2]
STUDENT = "nobody"


@pytest.fixture()
def open_tmp() -> Iterator[Path]:
    """A folder every user can enter (pytest's own tmp_path is root's only)."""
    folder = Path(tempfile.mkdtemp(prefix="labkit-keys-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


def _checkout(base: Path) -> Path:
    """A world-readable copy of what a checkout holds: keys, a solution, a git history."""
    base.mkdir(mode=0o755)
    (base / "solutions" / "_grading").mkdir(parents=True)
    (base / "solutions" / "ps1").mkdir()
    shutil.copy(REPO / "solutions" / "_grading" / "ps1_numbers.py",
                base / "solutions" / "_grading" / "ps1_numbers.py")
    (base / "solutions" / "ps1" / "ps1.ipynb").write_text("{}")
    (base / ".git" / "objects").mkdir(parents=True)
    for path in [base, *base.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return base


def test_the_checkout_is_closed_and_what_stays_open_is_reported(open_tmp: Path) -> None:
    tmp_path = open_tmp
    checkout = _checkout(tmp_path / "labkit")
    course = tmp_path / "course"
    shutil.copytree(checkout / "solutions", course / "solutions")
    course.chmod(0o700)
    key = checkout / "solutions" / "_grading" / "ps1_numbers.py"
    assert keys.readable_by(STUDENT, [key]) == [key]  # the hole: an editable install's keys
    lines = keys.audit(STUDENT, course, [checkout])
    assert keys.readable_by(STUDENT, keys.secret_files(checkout)) == [checkout / ".git" / "objects"]
    assert keys.readable_by(STUDENT, keys.secret_files(course)) == []
    assert f"keys: {checkout / 'solutions'} closed (mode 700, owner only)" in lines[0]
    assert lines[1:] == [f"NOT protected: {STUDENT} can read {checkout / '.git' / 'objects'} "
                         f"(history (every committed solution)); chmod -R go-rwx "
                         f"{checkout / '.git'}"]
    shutil.rmtree(checkout / ".git")
    assert keys.audit(STUDENT, course, [checkout])[1] == (
        "protected: answer keys, solutions, the course secret and the gradebook (4 files "
        f"checked as {STUDENT}, none readable)")


def test_the_package_checkout_is_found_and_a_worktree_history_resolved() -> None:
    """An editable install runs from this checkout: it is found, and a worktree's ``.git``
    file leads to the history it shares (``commondir``)."""
    assert REPO in keys.checkouts()
    git = keys.git_dir(REPO)
    assert git is not None and (git / "objects").is_dir()


def test_the_course_secret_replaces_the_committed_one(tmp_path: Path) -> None:
    grading = instructor.folder(tmp_path)
    grading.mkdir(parents=True)
    shutil.copy(REPO / "solutions" / "_grading" / "ps1_numbers.py", grading)
    committed = instructor.load("ps1_numbers", tmp_path)
    assert committed is not None
    before = committed.cases("ring_bytes", "alice")
    keys.write_course_secret(grading, 0, 0)
    assert (grading / instructor.SECRET_FILE).stat().st_mode & 0o777 == 0o600
    module = instructor.load("ps1_numbers", tmp_path)
    assert module is not None
    assert (grading / instructor.SECRET_FILE).read_text().strip() == module.SECRET
    assert module.SECRET != "" and module.cases("ring_bytes", "alice") != before
