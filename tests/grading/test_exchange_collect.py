"""The class's collect step against a student who writes what she likes into the exchange.

Two system accounts stand in for two students (``daemon`` is alice, ``nobody`` is bob);
root makes their folders in a real ``inbound`` with their ownership, and ``nbgrader
collect`` runs with ``labkit course hub``'s plugin (``labkit.grading.exchange.SafeCollect``).
Alice's folder links to the instructor's key and to ``/etc/shadow``, hard-links a
root-only file, holds a fifo, claims 2020 as its time; a second folder of hers is named for
bob with a later time; a third entry is a symlink to a folder. With nbgrader's own collect
bob's work is replaced by hers and the key is copied (issue 35, item 2); here bob's honest
submission is collected, none of the instructor's bytes are, each bad entry is reported,
and collect finishes for both. Needs root (to own files as two users).
"""

from __future__ import annotations

import datetime as dt
import os
import pwd
from pathlib import Path

import pytest

from labkit.grading import course
from labkit.grading.exchange import safe_copy

pytestmark = [pytest.mark.lesson08,
              pytest.mark.skipif(os.geteuid() != 0, reason="owns files as two users: root")]
KEY = "SECRET = 'instructor-only-3141'\n"
HONEST = '{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5, "bob": 1}'
ALICE, BOB = "daemon", "nobody"


def _own(path: Path, user: str) -> None:
    info = pwd.getpwnam(user)
    for p in [path, *path.rglob("*")] if path.is_dir() and not path.is_symlink() else [path]:
        os.chown(p, info.pw_uid, info.pw_gid, follow_symlinks=False)


def _submission(inbound: Path, name: str, user: str, files: dict[str, str]) -> Path:
    folder = inbound / name
    folder.mkdir()
    for rel, text in files.items():
        (folder / rel).write_text(text)
    _own(folder, user)
    return folder


@pytest.fixture()
def exchange(tmp_path: Path) -> dict[str, Path]:
    tmp_path.chmod(0o755)
    secret = tmp_path / "instructor" / "ps1.py"
    secret.parent.mkdir(mode=0o700)
    secret.write_text(KEY)
    secret.chmod(0o600)
    inbound = tmp_path / "exchange" / "labkit" / "inbound"
    inbound.mkdir(parents=True)
    inbound.chmod(0o2733)
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f UTC")
    _submission(inbound, f"{BOB}+ps1+{now}", BOB, {"ps1.ipynb": HONEST, "timestamp.txt": now,
                                                    "submission_secret.txt": "ab" * 64})
    forged = "2020-01-01 00:00:00.000000 UTC"
    alice = _submission(inbound, f"{ALICE}+ps1+{forged}", ALICE, {"timestamp.txt": forged,
                                                                   "notes.txt": "mine"})
    (alice / "ps1.ipynb").symlink_to(secret)
    (alice / "shadow").symlink_to("/etc/shadow")
    os.link(secret, alice / "linked.py")  # a hard link: owned by root, not by alice
    os.mkfifo(alice / "pipe")
    os.utime(alice / "notes.txt", (1577836800, 1577836800))  # mtime 2020: hers to set
    _own(alice, ALICE)
    os.chown(alice / "linked.py", 0, 0)
    _submission(inbound, f"{BOB}+ps1+2099-01-01 00:00:00.000000 UTC", ALICE,
                {"ps1.ipynb": HONEST.replace('"bob": 1', '"alice": 1')})
    (inbound / f"{ALICE}+ps1+2030-01-01 00:00:00.000000 UTC").symlink_to(secret.parent)
    root = tmp_path / "course"
    (root / "course").mkdir(parents=True)
    (root / "nbgrader_config.py").write_text(
        "c = get_config()\nc.CourseDirectory.root = 'course'\n"
        "c.CourseDirectory.course_id = 'labkit'\n"
        f"c.Exchange.root = {str(tmp_path / 'exchange')!r}\n"
        "c.ExchangeFactory.collect = 'labkit.grading.exchange.SafeCollect'\n")
    return {"root": root, "inbound": inbound, "secret": secret}


def test_collect_takes_identity_from_the_owner_time_from_the_disk_and_no_links(
        exchange: dict[str, Path]) -> None:
    proc = course.nbgrader(["collect", "ps1"], exchange["root"], timeout=300)
    log = proc.stderr
    assert proc.returncode == 0, log[-3000:]
    submitted = exchange["root"] / "course" / "submitted"
    assert sorted(p.name for p in submitted.iterdir()) == [ALICE, BOB], log[-3000:]
    # (b) bob's own submission, not the folder alice named for him
    assert (submitted / BOB / "ps1" / "ps1.ipynb").read_text() == HONEST
    assert (submitted / BOB / "ps1" / "submission_secret.txt").read_text() == "ab" * 64
    assert f"named for '{BOB}' but made by '{ALICE}'; skipped" in log
    # (a), (d): no byte of the key, no link followed, each entry left out reported
    for path in submitted.rglob("*"):
        assert path.is_dir() or (not path.is_symlink() and KEY not in path.read_text()), path
    got = sorted(p.name for p in (submitted / ALICE / "ps1").iterdir())
    assert got == ["notes.txt", "submission_secret.txt", "timestamp.txt"], (got, log[-3000:])
    # (d) without nbgrader's secret, release_feedback would stop for everyone after her
    assert "left out submission_secret.txt: missing or not nbgrader's (hex)" in log
    for entry, why in (("ps1.ipynb", "a symlink"), ("shadow", "a symlink"),
                       ("linked.py", "owned by root, not the submitter"),
                       ("pipe", "not a plain file")):
        assert f"left out {entry}: {why}" in log, (entry, log[-3000:])
    assert "not a folder (a symlink or file); skipped" in log
    # (c) the time is the file system's, not 2020 from timestamp.txt or the folder's name
    when = (submitted / ALICE / "ps1" / "timestamp.txt").read_text()
    assert when.startswith(str(dt.datetime.now(dt.timezone.utc).year)), when
    assert "timestamp.txt says 2020-01-01 00:00:00.000000 UTC" in log


def test_safe_copy_never_follows_a_symlink_swapped_in_for_a_folder(tmp_path: Path) -> None:
    """The copy walks open folders with O_NOFOLLOW: a folder entry that is a symlink is
    reported and skipped, and a submission that is itself a symlink is refused."""
    tmp_path.chmod(0o755)
    src = tmp_path / "sub"
    (src / "inner").mkdir(parents=True)
    (src / "inner" / "a.txt").write_text("a")
    (src / "up").symlink_to(tmp_path)
    _own(src, BOB)
    uid = pwd.getpwnam(BOB).pw_uid
    report = safe_copy(src, tmp_path / "out", uid)
    assert (tmp_path / "out" / "inner" / "a.txt").read_text() == "a"
    assert not (tmp_path / "out" / "up").exists()
    assert report.skipped == ["up: a symlink (never followed)"]
    (tmp_path / "link").symlink_to(src)
    with pytest.raises(OSError):
        safe_copy(tmp_path / "link", tmp_path / "out2", uid)
    with pytest.raises(PermissionError, match="not owned by uid"):
        safe_copy(src, tmp_path / "out3", 0)


def test_the_course_folder_is_the_instructors_before_a_student_can_take_it(
        tmp_path: Path) -> None:
    """``labkit course hub`` makes ``exchange/labkit`` the instructor's with nbgrader's modes
    (item 2e); a folder a student made there first is refused, naming its owner."""
    from labkit.base.errors import LabError
    from labkit.grading.exchange import COURSE_MODES, own_course_folder
    from labkit.grading.hub import HubPlan, nbgrader_config

    root = tmp_path / "exchange"
    root.mkdir(mode=0o1777)
    own_course_folder(root, "labkit", BOB)
    for sub, mode in COURSE_MODES.items():
        info = (root / "labkit" / sub).stat()
        assert (info.st_uid, info.st_mode & 0o7777) == (pwd.getpwnam(BOB).pw_uid, mode), sub
    own_course_folder(root, "labkit", BOB)  # running the set-up again is fine
    squat = root / "other"
    squat.mkdir()
    _own(squat, ALICE)
    with pytest.raises(LabError, match=rf"belongs to '{ALICE}', not the instructor \('{BOB}'\)"):
        own_course_folder(root, "other", BOB)
    text = nbgrader_config(HubPlan(students=("ann",), exchange=root))
    assert "c.ExchangeFactory.collect = 'labkit.grading.exchange.SafeCollect'" in text
