"""nbgrader's collect step for a shared exchange, where students write what they like into it.

nbgrader's file exchange (nbgrader's docs, "Managing assignment files" and "Exchange") keeps
submissions in ``<root>/<course>/inbound``, which every student may write. Its ``collect``
trusts that folder: the student is whoever the folder's *name* says, the time is the one the
student wrote into ``timestamp.txt``, files are copied with ``shutil.copytree`` (which follows
symlinks, as the instructor), and one unreadable file stops collect for everyone after it.
``SafeCollect`` keeps nbgrader's flow and replaces what it trusts:

1. **identity**: the student is the folder's owner (``lstat``, never the name). A folder
   named for someone else is skipped and reported; so is one that is a symlink.
2. **time**: the latest change time (``st_ctime``) of anything in the submission. A student
   can set a file's modification time (``utime``) but not its change time, which the kernel
   sets to now at every change; ``timestamp.txt`` in the collected copy is rewritten to it.
3. **copy**: folder by folder through open descriptors (``O_NOFOLLOW``), so a symlink is
   never followed, even one swapped in during the copy; only plain files and folders owned
   by the submitter are copied (a hard link to someone else's file is not), with a bound on
   their number and nbgrader's ``max_file_size``; everything left out is reported.
4. **isolation**: a folder that fails is skipped with its reason, the others are collected.

``labkit course hub`` selects it for the class (``c.ExchangeFactory.collect``) and creates
``<root>/<course>`` owned by the instructor, so no student can take that name first. A single
machine without a hub keeps nbgrader's own exchange.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fnmatch
import os
import pwd
import re
import secrets
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from nbgrader.exchange.default.collect import ExchangeCollect
from traitlets import Int

_SECRET = re.compile(r"[0-9a-f]{16,256}")  # nbgrader's submit writes token_hex(64)
MAX_ENTRIES = 2000  # files and folders in one submission; a problem set has a handful
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK  # NONBLOCK: a fifo never hangs us


@dataclass(kw_only=True)
class Submission:
    """One folder of ``inbound`` that passed the identity check."""

    folder: str
    """The folder's name in ``inbound`` (``<student>+<assignment>+<time>[+<random>]``)."""
    student: str
    """The folder's owner, which is also the name the folder gives."""
    when: dt.datetime
    """The latest change time of anything in it (UTC, naive as nbgrader keeps times)."""
    claimed: str = ""
    """What the student's ``timestamp.txt`` said, when it disagrees with ``when``."""


@dataclass(kw_only=True)
class CopyReport:
    """What a safe copy left out, one line each."""

    skipped: list[str] = field(default_factory=list)
    """Entries not copied, each with why (a symlink, someone else's file, too large, ...)."""


def _text(path: Path) -> str:
    try:
        return path.read_text()[:1000]
    except (OSError, UnicodeDecodeError):
        return ""


def owner_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def _utc(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).replace(tzinfo=None)


def changed_at(dir_fd: int, limit: int = MAX_ENTRIES) -> float:
    """The latest ``st_ctime`` of the folder open as ``dir_fd`` and everything in it."""
    latest, todo, seen = os.fstat(dir_fd).st_ctime, [os.dup(dir_fd)], 0
    while todo:
        fd = todo.pop()
        try:
            for name in os.listdir(fd):
                seen += 1
                if seen > limit:
                    raise ValueError(f"more than {limit} files and folders")
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                latest = max(latest, info.st_ctime)
                if stat.S_ISDIR(info.st_mode):
                    todo.append(os.open(name, _OPEN_DIR, dir_fd=fd))
        finally:
            os.close(fd)
    return latest


def _copy_file(src_dir: int, name: str, dest: Path, max_bytes: int | None) -> None:
    fd = os.open(name, _OPEN_FILE, dir_fd=src_dir)
    try:
        info = os.fstat(fd)
        if max_bytes is not None and info.st_size > max_bytes:
            raise ValueError(f"{info.st_size} bytes, over the limit of {max_bytes}")
        with os.fdopen(os.dup(fd), "rb") as src, dest.open("xb") as out:
            shutil.copyfileobj(src, out)
    finally:
        os.close(fd)


def safe_copy(src: Path, dest: Path, uid: int, *, ignore: list[str] | None = None,
              max_bytes: int | None = None, limit: int = MAX_ENTRIES) -> CopyReport:
    """Copy the folder ``src`` to ``dest``: plain files and folders owned by ``uid`` only,
    never through a symlink; what was left out, and why, in the report."""
    report = CopyReport()
    top = os.open(src, _OPEN_DIR)
    if os.fstat(top).st_uid != uid:
        os.close(top)
        raise PermissionError(f"{src} is not owned by uid {uid}")
    dest.mkdir(parents=True)
    todo, seen = [(top, dest, "")], 0
    while todo:
        fd, out, rel = todo.pop()
        try:
            for name in sorted(os.listdir(fd)):
                seen += 1
                if seen > limit:
                    raise ValueError(f"more than {limit} files and folders")
                path = f"{rel}{name}"
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                why = _refuse(path, info, uid, ignore or [])
                if why:
                    report.skipped.append(f"{path}: {why}")
                elif stat.S_ISDIR(info.st_mode):
                    (out / name).mkdir()
                    todo.append((os.open(name, _OPEN_DIR, dir_fd=fd), out / name, path + "/"))
                else:
                    try:
                        _copy_file(fd, name, out / name, max_bytes)
                    except (OSError, ValueError) as exc:
                        report.skipped.append(f"{path}: {exc}")
        finally:
            os.close(fd)
    return report


def _refuse(path: str, info: os.stat_result, uid: int, ignore: list[str]) -> str:
    """Why the entry ``path`` is not copied, or "" to copy it."""
    if stat.S_ISLNK(info.st_mode):
        return "a symlink (never followed)"
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
        return "not a plain file or folder"
    if info.st_uid != uid:
        return f"owned by {owner_name(info.st_uid) or info.st_uid}, not the submitter"
    if any(fnmatch.fnmatch(path.rsplit("/", 1)[-1], pattern) for pattern in ignore):
        return "ignored (CourseDirectory.ignore)"
    return ""


def read_inbound(inbound: Path, assignment: str, student: str | None = None
                 ) -> tuple[list[Submission], list[str]]:
    """The submissions of ``assignment`` in ``inbound`` (each checked), and the problems."""
    found, problems = [], []
    for entry in sorted(os.listdir(inbound)):
        parts = entry.split("+")
        if len(parts) < 3 or parts[1] != assignment:
            continue
        if student and parts[0] != student:
            continue
        try:
            info = (inbound / entry).lstat()
            if not stat.S_ISDIR(info.st_mode):
                problems.append(f"{entry}: not a folder (a symlink or file); skipped")
                continue
            owner = owner_name(info.st_uid)
            if owner != parts[0]:
                problems.append(f"{entry}: named for {parts[0]!r} but made by "
                                f"{owner or info.st_uid!r}; skipped (a student's identity "
                                "is the folder's owner)")
                continue
            fd = os.open(inbound / entry, _OPEN_DIR)
            try:
                when = _utc(changed_at(fd))
            finally:
                os.close(fd)
            found.append(Submission(folder=entry, student=owner, when=when,
                                    claimed=_claimed(inbound / entry, when)))
        except (OSError, ValueError) as exc:
            problems.append(f"{entry}: {exc}; skipped")
    return found, problems


def _claimed(folder: Path, when: dt.datetime) -> str:
    """The student's own ``timestamp.txt`` when it is more than a minute off ``when``."""
    with contextlib.suppress(OSError, ValueError, UnicodeDecodeError):
        fd = os.open(folder / "timestamp.txt", _OPEN_FILE)
        with os.fdopen(fd, "rb") as fh:
            text = fh.read(200).decode().strip()
        from nbgrader.utils import parse_utc

        if abs((parse_utc(text) - when).total_seconds()) > 60:
            return text
    return ""


class SafeCollect(ExchangeCollect):  # type: ignore[misc]
    """nbgrader's collect with the checks of this module's docstring (select it with
    ``c.ExchangeFactory.collect = 'labkit.grading.exchange.SafeCollect'``)."""

    max_entries = Int(MAX_ENTRIES, help="Files and folders one submission may hold."
                      ).tag(config=True)

    def init_src(self) -> None:
        if not self.coursedir.course_id:
            self.fail("No course id specified. Re-run with --course flag.")
        self.inbound_path = os.path.join(self.root, self.coursedir.course_id, "inbound")
        if not os.path.isdir(self.inbound_path):
            self.fail(f"Course not found: {self.inbound_path}")
        found, self.problems = read_inbound(Path(self.inbound_path),
                                            self.coursedir.assignment_id,
                                            self.coursedir.student_id.strip("*") or None)
        for line in self.problems:
            self.log.warning("labkit collect: %s", line)
        self.duedate = self._duedate()
        latest: dict[str, Submission] = {}
        for sub in sorted(found, key=lambda s: s.when):
            on_time = self.duedate is None or not self.before_duedate or sub.when <= self.duedate
            if on_time or sub.student not in latest:
                latest[sub.student] = sub
        self.src_records = [{"username": s.student, "filename": s.folder, "timestamp": s.when,
                             "claimed": s.claimed} for s in latest.values()]

    def _duedate(self) -> dt.datetime | None:
        from nbgrader.api import Gradebook, MissingEntry

        with Gradebook(self.coursedir.db_url, self.coursedir.course_id) as gb:
            try:
                return gb.find_assignment(self.coursedir.assignment_id).duedate  # type: ignore[no-any-return]
            except MissingEntry:
                return None

    def copy_files(self) -> None:
        assignment = self.coursedir.assignment_id
        self.log.info("Processing %d submissions of '%s'", len(self.src_records), assignment)
        for rec in self.src_records:
            student, when = rec["username"], rec["timestamp"]
            dest = Path(self.coursedir.format_path(self.coursedir.submitted_directory,
                                                   student, assignment))
            if dest.is_dir():
                have = self.coursedir.get_existing_timestamp(str(dest))
                newer = have is None or when > have
                if not ((self.update and newer) or (self.before_duedate and have != when)):
                    self.log.info("Already collected (use --update for a newer one): %s %s",
                                  student, assignment)
                    continue
            try:
                self._collect_one(rec, dest)
            except (OSError, ValueError) as exc:
                shutil.rmtree(dest, ignore_errors=True)
                self.log.warning("labkit collect: %s: %s; skipped", rec["filename"], exc)

    def _collect_one(self, rec: dict[str, object], dest: Path) -> None:
        src = Path(self.inbound_path) / str(rec["filename"])
        uid = pwd.getpwnam(str(rec["username"])).pw_uid
        staging = dest.with_name(dest.name + ".collecting")
        shutil.rmtree(staging, ignore_errors=True)
        max_kb = self.coursedir.max_file_size
        report = safe_copy(src, staging, uid, ignore=list(self.coursedir.ignore),
                           max_bytes=None if max_kb is None else int(max_kb) * 1024,
                           limit=self.max_entries)
        when = rec["timestamp"]
        assert isinstance(when, dt.datetime)
        (staging / "timestamp.txt").write_text(when.strftime("%Y-%m-%d %H:%M:%S.%f UTC"))
        if not _SECRET.fullmatch(_text(staging / "submission_secret.txt")):
            # release_feedback stops for every student at one without it (issue 35, 2d)
            (staging / "submission_secret.txt").write_text(secrets.token_hex(64))
            report.skipped.append("submission_secret.txt: missing or not nbgrader's (hex); a "
                                  "new one was made (this feedback is not fetched by the "
                                  "panel: hand it over)")
        shutil.rmtree(dest, ignore_errors=True)
        staging.rename(dest)
        self.log.info("Collecting submission: %s %s (%s, from the file system)",
                      rec["username"], self.coursedir.assignment_id, when)
        if rec["claimed"]:
            self.log.warning("labkit collect: %s: timestamp.txt says %s; the file system "
                             "says %s, which is kept", rec["filename"], rec["claimed"], when)
        for line in report.skipped:
            self.log.warning("labkit collect: %s: left out %s", rec["filename"], line)


# nbgrader's own modes for the course's folders (release_assignment, release_feedback):
# students list and read outbound, write but never list inbound, reach feedback by its hash
COURSE_MODES = {"": 0o755, "outbound": 0o755, "inbound": 0o2733, "feedback": 0o711}


def own_course_folder(root: Path, course_id: str, user: str) -> list[str]:
    """Make ``root/course_id`` and its three folders, owned by ``user`` (the instructor)
    with nbgrader's modes, before any student can make them (``root`` is writable by all).
    A course folder someone else made first is refused with its owner."""
    info = pwd.getpwnam(user)
    course = root / course_id
    if course.is_symlink() or (course.exists() and course.lstat().st_uid not in (0, info.pw_uid)):
        from labkit.base.errors import LabError

        owner = owner_name(course.lstat().st_uid) or course.lstat().st_uid
        raise LabError(f"{course} exists and belongs to {owner!r}, not the instructor "
                       f"({user!r}): a student may have made it to take the course's exchange; "
                       f"remove it (rm -r {course}) and run labkit course hub again")
    for sub, mode in COURSE_MODES.items():
        folder = course / sub if sub else course
        folder.mkdir(exist_ok=True)
        os.chown(folder, info.pw_uid, info.pw_gid, follow_symlinks=False)
        os.chmod(folder, mode)
    return [f"exchange: {course} owned by {user} (made before any student could)"]
