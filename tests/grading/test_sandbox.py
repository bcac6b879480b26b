"""The grading box in each mode this machine has: what it hides, what it still allows.

``bwrap`` and ``unshare`` must hide the course's instructor files, keep the rest read-only,
bring loopback up so real gloo ranks run, and take every process with them when they
stop (a detached daemon included). ``none`` is the documented unprotected fallback: the
test pins that it still runs cells and calls, and that it does NOT hide files, so the
documentation's warning stays true.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from labkit.base.errors import ConfigError
from labkit.grading.sandbox import box as boxes
from labkit.grading.sandbox.box import Box
from labkit.grading.sandbox.modes import under_private_tmp
from labkit.grading.sandbox.remote import RemoteFunction, Session
from tests.conftest import processes_holding

pytestmark = [pytest.mark.grading, pytest.mark.lesson08]
REPO = Path(__file__).resolve().parents[2]
UNDER_TMP = under_private_tmp(REPO)
ISOLATING = [pytest.param(m, marks=pytest.mark.skipif(
    m == "unshare" and UNDER_TMP, reason=f"the unshare box hides {REPO} (under a temp dir)"))
    for m in ("bwrap", "unshare") if boxes.available(m)]

PROBE = f'''import os
course = {str(REPO)!r}
print("VISIBLE", sorted(p for p in ("solutions", "course", ".git", "nbgrader_config.py")
                        if os.path.exists(os.path.join(course, p)) and
                        (not os.path.isdir(os.path.join(course, p)) or
                         os.listdir(os.path.join(course, p)))
                        and os.path.getsize(os.path.join(course, p)) > 0))
try:
    open({str(REPO / "labkit" / "x.txt")!r}, "w")
    print("WRITABLE")
except OSError as exc:
    print("READ-ONLY", type(exc).__name__)
'''


def daemon_cell(token: str) -> str:
    return ("import subprocess, sys\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
            f"start_new_session=True, env={{'LABKIT_TEST_TOKEN': {token!r}}})")


@pytest.mark.parametrize("mode", ISOLATING)
def test_isolating_box_hides_the_course_runs_ranks_and_takes_its_processes_along(mode: str
                                                                                ) -> None:
    token = f"labkit-box-{uuid.uuid4().hex}"
    session = Session(mode=mode, course_root=REPO, cell_timeout=30).start()
    try:
        reply = session.run_cell(PROBE)
        assert "VISIBLE []" in reply["stdout"], reply
        assert "READ-ONLY" in reply["stdout"], reply
        ranks = session.run_cell("import labkit\nprint(labkit.launch(lambda ctx: ctx.rank, 2)"
                                 ".results)")
        assert "[0, 1]" in ranks.get("stdout", ""), ranks  # loopback is up: gloo works
        session.run_cell(daemon_cell(token))
        time.sleep(0.5)
        assert processes_holding(token), "the daemon did not start"
    finally:
        session.close()
    deadline = time.monotonic() + 5
    while processes_holding(token) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_holding(token) == [], "a process outlived the box"
    assert not (REPO / "labkit" / "x.txt").exists()


def test_fallback_none_still_grades_out_of_process_but_hides_nothing(tmp_path: Path) -> None:
    """Mode none: no namespaces. Cells and calls work; files are NOT hidden (documented)."""
    marker = tmp_path / "instructor.txt"
    marker.write_text("secret")
    session = Session(mode="none", cell_timeout=10).start()
    try:
        session.run_cell("def f(x):\n    return {'twice': 2 * x, 'tuple': (x, x)}")
        assert RemoteFunction(session, "f")(21) == {"twice": 42, "tuple": (21, 21)}
        seen = session.run_cell(f"print(open({str(marker)!r}).read())")
        assert "secret" in seen["stdout"]  # what docs/instructors.md warns about
    finally:
        session.close()


def test_a_cell_that_ignores_ctrl_c_is_killed_and_the_box_rebuilt() -> None:
    """Soft limit (SIGINT) first; a cell that blocks it is stopped by killing the box, and
    the cells that finished before are replayed into a fresh one."""
    session = Session(cell_timeout=2).start()
    try:
        session.run_cell("x = 41")
        start = time.monotonic()
        reply = session.run_cell("import signal, time\n"
                                 "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                                 "while True:\n    time.sleep(0.05)")
        assert reply["error"]["ename"] == "CellTimeout"
        assert time.monotonic() - start < 2 + 3 + 10  # limit + grace + restart
        assert session.restarts == 1
        assert "42" in session.run_cell("print(x + 1)")["stdout"]  # replayed
    finally:
        session.close()


def test_unshare_refuses_a_course_under_a_temp_dir_with_the_way_out(tmp_path: Path) -> None:
    """Its box mounts an empty /tmp: a course there would vanish, so it says so up front."""
    from labkit.grading.sandbox.modes import unshare_cmd

    with pytest.raises(ConfigError, match=r"would vanish inside it.*install bubblewrap"):
        unshare_cmd(tmp_path)


def test_bad_mode_is_refused_before_anything_starts() -> None:
    with pytest.raises(ConfigError, match="one of auto, bwrap, unshare, none"):
        Box(mode="docker")


def test_a_cell_over_its_cpu_limit_is_stopped_with_a_line_and_the_next_cell_runs() -> None:
    """CPU is read from outside the box: a busy loop is stopped at the cell's CPU limit (not
    its wall limit), the cell's output gets a line naming the limit, the box is rebuilt,
    and the CPU it used still counts for the notebook after the restart."""
    from labkit.grading.sandbox.limits import Limits

    session = Session(cell_timeout=30, limits=Limits(cell_cpu_s=2)).start()
    try:
        start = time.monotonic()
        reply = session.run_cell("x = 1\nwhile True:\n    x += 1")
        assert reply["error"]["ename"] == "CellLimit"
        assert time.monotonic() - start < 25  # well before the 30 s wall limit
        assert session.notes == ["labkit grading limit: this cell used more than 2 CPU "
                                 "seconds; it was stopped and its box started again."]
        used = session._cpu_s()
        assert used >= 2
        assert "42" in session.run_cell("print(41 + 1)")["stdout"]
        assert session._cpu_s() >= used
    finally:
        session.close()


def test_once_the_notebook_has_used_its_time_later_cells_are_not_run() -> None:
    """A notebook whose cells each hang just under the cell limit still ends: past
    notebook_timeout, the remaining cells are not run, with a line saying why."""
    from labkit.grading.sandbox.limits import Limits

    session = Session(cell_timeout=30, limits=Limits(notebook_timeout=2)).start()
    try:
        session.run_cell("import time\ntime.sleep(3)")
        reply = session.run_cell("print('never')")
        assert reply["error"]["evalue"] == "not run: the notebook used its 2 s of time"
        assert session.notes == ["labkit grading limit: not run: the notebook used its 2 s of "
                                 "time."]
    finally:
        session.close()
