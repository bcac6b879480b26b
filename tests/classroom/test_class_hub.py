"""A class on one server, for real (issue 26): JupyterHub, nbgrader's exchange, four students.

``labkit course hub`` sets the class up (users, course, exchange, configs, the sandbox's
cgroup); JupyterHub and its proxy serve it on loopback ports; each student logs in with
PAM in a real (headless) browser, fetches ps1 and ps3 from the Assignments panel, works
(an honest, a partial, a cheating and an empty submission), runs labkit ranks at the same
time as the others, and submits from the panel; the instructor collects, autogrades in
the box, and releases feedback; each student fetches their own feedback and can reach no
one else's. The module's fixture removes every user, server, proxy and rank afterwards,
also when a step fails, and asserts that nothing is left.

Run it on its own: ``pytest -m classroom tests/classroom`` (``.ci/run`` does).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import pytest

from tests.classroom.browser import Student
from tests.classroom.support import Users, as_user, class_python, free_port, stop
from tests.grading.test_grading_attacks import HONEST_GLOBAL
from tests.grading.test_grading_box import PROBE, WATCHER_OFF
from tests.grading.test_nbgrader_flow import PRIVATE_ALLREDUCE

pytestmark = [pytest.mark.classroom, pytest.mark.timeout(1800)]
REPO = Path(__file__).resolve().parents[2]
ASSIGNMENTS = ("ps1_numbers", "ps3_build_it")
KINDS = ("honest", "partial", "cheating", "empty")


def _missing() -> str | None:
    """Why this machine cannot run the class, or None."""
    from labkit.grading.sandbox.modes import available

    if os.geteuid() != 0:
        return "creates users and runs JupyterHub: needs root"
    for tool in ("configurable-http-proxy", "runuser", "useradd"):
        if shutil.which(tool, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin") is None:
            return f"{tool} is missing (.ci/run installs it)"
    if not Path("/usr/bin/chromium").exists():
        return "Debian's chromium is missing (apt-get install chromium)"
    if not available("bwrap"):
        return "bubblewrap is missing (apt-get install bubblewrap)"
    for module in ("jupyterhub", "playwright", "pamela"):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed (pip install -e '.[dev]')"
    return None


@dataclass
class Classroom:
    users: Users
    base: Path
    python: str
    extra: dict[str, str]
    url: str
    setup_output: str
    secret: str = field(default_factory=lambda: f"grader-{secrets.token_hex(8)}")
    students: dict[str, Student] = field(default_factory=dict)
    browser: Any = None

    @property
    def course(self) -> Path:
        return Path(f"/home/{self.users.instructor}/labkit-course")

    def env(self, user: str) -> dict[str, str]:
        """A user's environment: their servers' (hub config), plus a secret of the grader's."""
        return {"PATH": f"{Path(self.python).parent}:/usr/local/bin:/usr/bin:/bin",
                "HOME": f"/home/{user}", "PYTHONPATH": str(REPO), "LANG": "C.UTF-8",
                "JUPYTER_CONFIG_PATH": str(self.base / "etc"), "LABKIT_GRADER_SECRET":
                self.secret, **self.extra}

    def instructor(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``nbgrader ARGS`` as the instructor, in the course folder."""
        proc = as_user(self.users.instructor, [self.python, "-m", "nbgrader", *args],
                       self.env(self.users.instructor), self.course)
        assert proc.returncode == 0, f"nbgrader {' '.join(args)}: {proc.stderr[-3000:]}"
        return proc

    def student(self, kind: str) -> Student:
        return self.students[self.users.student_names[KINDS.index(kind)]]

    @property
    def attacker(self) -> str:
        """The fifth student: no browser, a shell, and the exchange as her target."""
        return self.users.student_names[len(KINDS)]

    def as_attacker(self, *args: str) -> subprocess.CompletedProcess[str]:
        return as_user(self.attacker, list(args), self.env(self.attacker), "/")


def _wait_for(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        assert time.monotonic() < deadline, f"{url} did not answer in {seconds:.0f} s"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def classroom() -> Iterator[Classroom]:
    why = _missing()
    if why:
        pytest.skip(why)
    base = Path(tempfile.mkdtemp(prefix="labkit-class-", dir="/tmp"))
    base.chmod(0o755)
    users = Users(prefix=f"lk{secrets.token_hex(3)}", students=len(KINDS) + 1)  # + attacker
    users.plan()
    cgroup = f"/labkit-grading-{users.prefix}"
    hub: subprocess.Popen[bytes] | None = None
    room: Classroom | None = None
    solutions_mode = (REPO / "solutions").stat().st_mode & 0o7777  # the set-up closes it
    try:
        python, extra = class_python(base)
        (base / "passwords").write_text("".join(f"{u}:{p}\n" for u, p in users.passwords.items()))
        (base / "passwords").chmod(0o600)
        port, hub_port, api_port = free_port(), free_port(), free_port()
        root_env = {**os.environ, **extra, "PYTHONPATH": str(REPO)}
        setup = subprocess.run(
            [python, "-m", "labkit", "course", "hub", "--instructor", users.instructor,
             "--students", ",".join(users.student_names), "--passwords",
             str(base / "passwords"), "--exchange", str(base / "exchange"), "--hub-dir",
             str(base / "hub"), "--config-dir", str(base / "etc"), "--port", str(port),
             "--hub-port", str(hub_port), "--api-port", str(api_port), "--python", python,
             "--pythonpath", str(REPO), "--cgroup", cgroup, "--server-memory-mb", "3072"],
            env=root_env, capture_output=True, text=True, timeout=600, check=False)
        assert setup.returncode == 0, setup.stderr[-3000:]
        log = (base / "hub.log").open("wb")
        hub = subprocess.Popen([python, "-m", "jupyterhub", "-f",
                                str(base / "hub" / "jupyterhub_config.py")],
                               cwd=base / "hub", env=root_env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        _wait_for(f"{url}/hub/login", 120)
        room = Classroom(users, base, python, extra, url, setup.stdout)
        yield room
    finally:
        if room is not None and room.browser is not None:
            room.browser.close()
        stop(hub)
        uids = users.remove()
        _remove_cgroups(cgroup)
        _remove_server_cgroups(users.names)
        (REPO / "solutions").chmod(solutions_mode)
        proxy = _proxy_left(base)
        shutil.rmtree(base, ignore_errors=True)
        left = users.processes(uids)
        assert hub is None or hub.poll() is not None, "the hub outlived the test"
        assert proxy is None, f"the proxy outlived the hub: pid {proxy}"
        assert left == [], f"processes of the class's users outlived it: {left}"
        assert users.uids() == [], "users outlived the test"


def _remove_cgroups(name: str) -> None:
    for folder in Path("/sys/fs/cgroup").glob(f"*/{name.strip('/')}"):
        for box in folder.glob("labkit-box-*"):
            box.rmdir()
        folder.rmdir()


def _remove_server_cgroups(names: list[str]) -> None:
    """The users' folders under LimitedSpawner's parent (each server removed its own)."""
    for mount in Path("/sys/fs/cgroup").iterdir():
        parent = mount / "labkit-users"
        for name in names:
            if (parent / name).is_dir():
                (parent / name).rmdir()
        with contextlib.suppress(OSError):  # another class's servers may still be in it
            parent.rmdir()


def _proxy_left(base: Path) -> int | None:
    """The proxy's pid if it still runs (killed here, reported by the caller)."""
    try:
        pid = int((base / "hub" / "proxy.pid").read_text())
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    if b"configurable-http-proxy" not in cmd:
        return None
    os.kill(pid, 9)
    return pid


# ---- the answers of the four students ------------------------------------------------------
def _solution(name: str) -> dict[str, str]:
    nb = nbformat.read(REPO / "solutions" / name / f"{name}.ipynb", as_version=4)
    return {c.metadata["nbgrader"]["grade_id"]: "\n".join(
        line for line in c.source.splitlines() if "### BEGIN SOLUTION" not in line
        and "### END SOLUTION" not in line) for c in nb.cells
        if c.metadata.get("nbgrader", {}).get("solution")}


def answers(kind: str, name: str) -> dict[str, str]:
    """What each kind of student writes into the answer cells (by grade id)."""
    if kind == "honest":
        return _solution(name)
    if kind == "partial":
        return ({"global_batch_answer": HONEST_GLOBAL,
                 "bubble_answer": "def bubble_share(stages, microbatches):\n"
                                  "    return (stages - 1) / microbatches\n"}
                if name == "ps1_numbers" else
                {"doubling_answer": _solution(name)["doubling_answer"]})
    if kind == "cheating":
        return ({"global_batch_answer": HONEST_GLOBAL, "adam_gb_answer": WATCHER_OFF,
                 "target_lr_answer": PROBE + "\n\nfrom labkit import theory\n\n\n"
                 "def target_lr(base_lr, base_batch, gpus, per_gpu_batch, accumulation):\n"
                 "    new = theory.global_batch(per_gpu_batch, gpus, accumulation)\n"
                 "    return theory.scaled_lr(base_lr, base_batch, new, 'linear')\n"}
                if name == "ps1_numbers" else {"doubling_answer": PRIVATE_ALLREDUCE})
    return {}


EXPECTED = {"honest": {"ps1_numbers": 14, "ps3_build_it": 13},
            "partial": {"ps1_numbers": 2, "ps3_build_it": 4},
            "cheating": {"ps1_numbers": 2, "ps3_build_it": 0},
            "empty": {"ps1_numbers": 0, "ps3_build_it": 0}}
RANKS = ("import time, labkit\nstart = time.time()\n"
         "result = labkit.run(strategy='ddp', world_size=2, steps=3, seed=0)\n"
         "print('RANKS', result.params_sha256, start, time.time())\n")


# ---- the class, in order ---------------------------------------------------------------------
def test_one_command_sets_up_the_class(classroom: Classroom) -> None:
    """`labkit course hub`: private homes and course, the exchange, a probe box that holds."""
    out = classroom.setup_output
    assert "grading box: bwrap, cgroup limits on, box's pid 1 hidden" in out, out
    for user in classroom.users.names:
        assert Path(f"/home/{user}").stat().st_mode & 0o777 == 0o700
    assert classroom.course.stat().st_mode & 0o777 == 0o700
    assert (classroom.base / "exchange").stat().st_mode & 0o7777 == 0o1777
    # item 2e: the course's exchange is the instructor's before any student could take it
    course_x = classroom.base / "exchange" / "labkit"
    assert course_x.stat().st_uid == pwd.getpwnam(classroom.users.instructor).pw_uid
    assert classroom.as_attacker("mkdir", str(course_x / "outbound" / "ps1_numbers")).returncode
    # item 3: the checkout labkit runs from is closed; what is still open is said, not hidden
    key = REPO / "solutions" / "_grading" / "ps1_numbers.py"
    read = classroom.as_attacker(classroom.python, "-c", f"print(open({str(key)!r}).read())")
    assert read.returncode != 0 and "Permission denied" in read.stderr, read
    assert "protected: solutions/, keys" not in out
    assert all("objects (history" in line for line in out.splitlines()
               if line.startswith("NOT protected:") and " can read " in line), out
    # item 9: each student's server in a cgroup of its own
    assert "protected: the class from one student's server (each in its own cgroup" in out, out
    for name in ASSIGNMENTS:
        classroom.instructor("generate_assignment", name, "--force")
        classroom.instructor("release_assignment", name)


def test_students_fetch_work_run_ranks_together_and_submit(classroom: Classroom) -> None:
    """Four students in a browser: fetch both problem sets, write their answers, run labkit
    ranks at the same time (each gets the run a single student gets), submit both."""
    from playwright.sync_api import sync_playwright

    import labkit

    playwright = sync_playwright().start()
    classroom.browser = playwright.chromium.launch(
        executable_path="/usr/bin/chromium", headless=True, args=["--no-sandbox"])
    for name in classroom.users.student_names[:len(KINDS)]:
        context = classroom.browser.new_context(viewport={"width": 1400, "height": 900})
        student = Student(context, classroom.url, name, classroom.users.passwords[name])
        student.log_in()
        student.assignments()
        for assignment in ASSIGNMENTS:
            student.fetch(assignment)
        classroom.students[name] = student
    ranks = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(RANKS)])
    ranks.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                    "language": "python"}
    for kind in KINDS:
        student = classroom.student(kind)
        for assignment in ASSIGNMENTS:
            if answers(kind, assignment):
                student.save(f"{assignment}/{assignment}.ipynb", answers(kind, assignment))
        student.save("ranks.ipynb", notebook=json.loads(nbformat.writes(ranks)))
    for student in classroom.students.values():  # all four start at once
        student.start_cell("ranks.ipynb")
    runs = [student.cell_output(r"RANKS (\w+) ([\d.]+) ([\d.]+)")
            for student in classroom.students.values()]
    reference = labkit.run(strategy="ddp", world_size=2, steps=3, seed=0).params_sha256
    assert {run.group(1) for run in runs} == {reference}, "a student's run was disturbed"
    spans = sorted((float(r.group(2)), float(r.group(3))) for r in runs)
    assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:])), \
        f"no two runs overlapped: {spans}"
    for student in classroom.students.values():
        student.assignments()
        for assignment in ASSIGNMENTS:
            student.submit(assignment)


FORGED = "2020-01-01 00:00:00.000000 UTC"
ATTACK = """set -e
in=$1/labkit/inbound; release=$1/labkit/outbound/ps1_numbers/ps1_numbers.ipynb
mine="$in/$2+ps1_numbers+$4"; theirs="$in/$3+ps1_numbers+2099-01-01 00:00:00.000000 UTC"
mkdir "$mine" "$theirs"
cp "$release" "$mine/"; cp "$release" "$theirs/"
printf '%s' "$4" > "$mine/timestamp.txt"
ln -s "$5/solutions/_grading/ps1_numbers.py" "$mine/key.py"
ln -s "$5/course/gradebook.db" "$mine/gradebook.db"
ln -s /etc/shadow "$mine/shadow"
touch -d 2020-01-01 "$mine/ps1_numbers.ipynb" "$mine/timestamp.txt"
"""


def test_a_student_attacks_the_exchange(classroom: Classroom) -> None:
    """The fifth student writes into inbound from a shell (issue 35, item 2): her own
    submission with links to the keys, the gradebook and /etc/shadow and a 2020 time, and a
    folder named for the honest student, later than his (the grading test checks the result)."""
    honest = classroom.users.student_names[KINDS.index("honest")]
    proc = classroom.as_attacker("/bin/sh", "-c", ATTACK, "sh", str(classroom.base / "exchange"),
                                 classroom.attacker, honest, FORGED, str(classroom.course))
    assert proc.returncode == 0, proc.stderr


def test_the_instructor_grades_in_the_box_and_releases_feedback(classroom: Classroom) -> None:
    """collect, autograde (each notebook in a box), generate and release feedback; each
    submission scores what its honest parts deserve; the attacker's folders are skipped or
    stripped, with a line each, and her time is the disk's."""
    from nbgrader.api import Gradebook

    honest, attacker = classroom.users.student_names[0], classroom.attacker
    for name in ASSIGNMENTS:
        collected = classroom.instructor("collect", name).stderr
        if name == "ps1_numbers":
            assert f"named for '{honest}' but made by '{attacker}'; skipped" in collected
            for link in ("key.py", "gradebook.db", "shadow"):
                assert f"left out {link}: a symlink (never followed)" in collected, collected
            assert f"timestamp.txt says {FORGED}" in collected, collected
            assert "left out submission_secret.txt: missing" in collected, collected
        start = time.monotonic()
        graded = classroom.instructor("autograde", name)
        print(f"autograde {name}: {time.monotonic() - start:.0f} s for "
              f"{len(KINDS)} students (load {os.getloadavg()[0]:.1f})")
        held = "in a 'bwrap' sandbox, limits held by a cgroup"  # the instructor's delegated one
        assert graded.stderr.count(held) >= len(KINDS), graded.stderr[-2000:]
        classroom.instructor("generate_feedback", name)
        classroom.instructor("release_feedback", name)
    with Gradebook(f"sqlite:///{classroom.course / 'course' / 'gradebook.db'}") as gb:
        got = {kind: {name: gb.find_submission(name, student).score for name in ASSIGNMENTS}
               for kind, student in zip(KINDS, classroom.users.student_names)}
        theirs = gb.find_submission("ps1_numbers", attacker)
        assert (theirs.score, theirs.timestamp.year) == (0, time.gmtime().tm_year), theirs
    assert got == EXPECTED, _short_cells(classroom, got)
    kept = classroom.course / "course" / "submitted" / attacker / "ps1_numbers"
    assert sorted(p.name for p in kept.iterdir()) == ["ps1_numbers.ipynb",
                                                      "submission_secret.txt", "timestamp.txt"]


def _short_cells(classroom: Classroom, got: dict[str, dict[str, float]]) -> str:
    """For each submission that scored other than expected: its grade cells, with what they
    printed in the box (the feedback page a failure would show is mostly CSS)."""
    lines = [f"scores {got}"]
    for kind, student in zip(KINDS, classroom.users.student_names):
        for name in ASSIGNMENTS:
            if got[kind][name] == EXPECTED[kind][name]:
                continue
            path = classroom.course / "course" / "autograded" / student / name / f"{name}.ipynb"
            for cell in nbformat.read(path, as_version=4).cells:
                grade = cell.metadata.get("nbgrader", {})
                if cell.cell_type != "code" or not grade.get("grade"):
                    continue
                shown = " | ".join(str(out.get("text") or out.get("evalue") or
                                       out.get("data", {}).get("text/plain", ""))
                                   for out in cell.get("outputs", []))
                lines.append(f"{kind} {name} {grade.get('grade_id')} "
                             f"({grade.get('points')} points): {shown[-1500:]}")
    return "\n".join(lines)


def test_each_student_sees_their_own_feedback_and_no_one_elses(classroom: Classroom) -> None:
    """Feedback fetched from the panel lands in the student's own home; the grader's
    environment is in no feedback; another student's home, the exchange's feedback and
    inbound folders and another student's server stay closed."""
    names = classroom.users.student_names
    for kind in KINDS:
        student = classroom.student(kind)
        student.assignments()
        for assignment in ASSIGNMENTS:
            student.fetch_feedback(assignment)
    for kind, name in zip(KINDS, names):
        for assignment in ASSIGNMENTS:
            pages = list(Path(f"/home/{name}/{assignment}/feedback").glob(f"*/{assignment}.html"))
            assert len(pages) == 1, f"{name}: {pages}"
            text = re.sub(r"<[^>]+>", "", pages[0].read_text())
            assert f"Score: {EXPECTED[kind][assignment]}" in text.replace("\n", " ") or \
                f"{EXPECTED[kind][assignment]} / " in text, text[:500]
            assert classroom.secret not in text
    cheat = next(Path(f"/home/{names[2]}/ps1_numbers/feedback").glob("*/ps1_numbers.html"))
    assert "it calls labkit.theory" in cheat.read_text()
    honest_file = f"/home/{names[0]}/ps1_numbers/ps1_numbers.ipynb"
    nosy = classroom.env(names[1])
    for probe in (["cat", honest_file], ["ls", str(classroom.base / "exchange/labkit/feedback")],
                  ["ls", str(classroom.base / "exchange/labkit/inbound")],
                  ["ls", str(classroom.course)]):
        proc = as_user(names[1], probe, nosy, "/")
        assert proc.returncode != 0 and "Permission denied" in proc.stderr, (probe, proc)
    page = classroom.student("partial").page
    reply = page.goto(f"{classroom.url}/user/{names[0]}/lab")
    assert reply is None or reply.status >= 400 or "ps1_numbers" not in page.content()
    print(sys.version.split()[0], "class done")


RUNAWAY = """import os, time
end, child = time.time() + 150, False
if os.fork() == 0:  # a memory hog
    chunks = []
    while time.time() < end:
        chunks.append(bytearray(64 << 20))
    os._exit(0)
while time.time() < end:  # a fork bomb: every process forks again
    try:
        child = os.fork() == 0 or child
    except OSError:
        time.sleep(0.05)
if child:
    os._exit(0)
print('RUNAWAY over')
"""


def _server_cgroups(name: str) -> list[Path]:
    """The folders of ``name``'s server cgroup (one per controller; LimitedSpawner's)."""
    return sorted(Path("/sys/fs/cgroup").glob(f"*/labkit-users/{name}/labkit-box-*"))


def test_a_runaway_notebook_leaves_the_other_kernels_running(classroom: Classroom) -> None:
    """A student's fork bomb and memory hog (issue 35, item 9) meet her own server's cgroup;
    the honest student's kernel runs a cell meanwhile and the hub keeps answering."""
    from labkit.grading.sandbox.limits import BoxCgroup
    from labkit.grading.spawner import clear

    runaway, honest = classroom.student("empty"), classroom.student("honest")
    one = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(RUNAWAY)])
    two = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('ALIVE', 6 * 7)")])
    for nb in (one, two):
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                     "language": "python"}
    runaway.save("runaway.ipynb", notebook=json.loads(nbformat.writes(one)))
    honest.save("alive.ipynb", notebook=json.loads(nbformat.writes(two)))
    folders = _server_cgroups(runaway.name)
    pids = next(f for f in folders if f.parent.parent.parent.name == "pids")
    try:
        runaway.start_cell("runaway.ipynb")
        deadline = time.monotonic() + 180
        while int((pids / "pids.events").read_text().split()[1]) == 0:
            assert time.monotonic() < deadline, "the fork bomb never met its server's pids.max"
            time.sleep(0.5)
        honest.start_cell("alive.ipynb")
        assert honest.cell_output(r"ALIVE (\d+)").group(1) == "42"
        bomb = int((pids / "pids.current").read_text())
        assert bomb > 300, f"the bomb was over before the other kernel answered ({bomb} tasks)"
        _wait_for(f"{classroom.url}/hub/login", 60)
        print(f"runaway: {bomb} tasks in her server's cgroup while the other kernel answered; "
              f"memory failures {BoxCgroup(folders, 1).events()}")
    finally:
        clear(BoxCgroup(folders, 1))  # her server goes too: the hub's stop finds it gone
