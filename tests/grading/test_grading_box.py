"""Crafted submissions against the grading box itself (issue 26), graded end to end.

Each attack a student who owns the interpreter could try, in a real notebook through
``labkit submit`` (nbgrader autograde in the box, then the feedback HTML):

* reading the grader's environment (``/proc/1/environ``, ``/proc/self/environ``,
  ``os.environ``) into the feedback, and ``ptrace`` on the box's first process;
* switching the in-box call watcher off and answering with ``labkit.theory``;
* (a ring all-reduce that looks for a process group of its own behind ring-shaped sends
  is in ``test_nbgrader_flow.py``, with labkit's own 1F1B plan);
* a fork bomb, a 30 GB allocation and a full ``/tmp`` in answer cells.

Each must score exactly what its honest parts deserve, with a line in the feedback when a
limit stopped something, and leave no process or cgroup behind. Hidden inputs are drawn
per student, and the feedback names only the graded student's own.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import nbformat
import pytest

from labkit.grading.sandbox.limits import box_parents
from tests.conftest import processes_holding
from tests.grading.test_grading_attacks import HONEST_GLOBAL, autograded_outputs
from tests.grading.test_nbgrader_flow import (
    feedback_text,
    grade,
    notebook,
    root,
    scores,
    set_cell,
)

pytestmark = [pytest.mark.grading, pytest.mark.lesson08]
__all__ = ["root"]

WRONG_GLOBAL = ("def global_batch_size(gpus, per_gpu_batch, accumulation):\n"
                "    return gpus * per_gpu_batch\n")  # right without accumulation only
HONEST_TARGET = ("def target_lr(base_lr, base_batch, gpus, per_gpu_batch, accumulation):\n"
                 "    return base_lr * gpus * per_gpu_batch * accumulation / base_batch\n")
HONEST_WARMUP = ("def warmup_lr(target_lr, step, warmup_steps):\n"
                 "    return target_lr * min(1.0, step / warmup_steps)\n")
PROBE = '''import ctypes, os, signal, time
print("ENVIRON", dict(os.environ))
print("SELF", open("/proc/self/environ", "rb").read())
for path in ("/proc/1/environ", "/proc/1/maps", "/proc/1/mem"):
    try:
        print(path, open(path, "rb").read(64))
    except OSError as exc:
        print(path, "refused:", type(exc).__name__)
libc = ctypes.CDLL(None, use_errno=True)
print("PTRACE 1:", libc.ptrace(16, 1, 0, 0), ctypes.get_errno())
child = os.fork()
if child == 0:
    time.sleep(30)
    os._exit(0)
print("PTRACE OWN CHILD:", libc.ptrace(16, child, 0, 0))
os.kill(child, signal.SIGKILL)
os.waitpid(child, 0)
'''
WATCHER_OFF = '''from labkit.grading.sandbox import watch
watch.CallWatch._profile = lambda self, frame, event, arg: None
watch.CallWatch.__exit__ = lambda self, *exc: None
from labkit import theory


def adam_gb_per_gpu(params, gpus, zero_stage):
    return theory.zero_memory(params, gpus, zero_stage)["total"] / 1e9
'''
KEY_BUBBLE = '''def bubble_share(stages, microbatches):
    from labkit.theory import bubble_fraction
    return bubble_fraction(stages, microbatches, "1f1b", relative_to="total")
'''


def test_the_graders_environment_stays_out_and_the_watcher_does_not_matter(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing of the grader's environment reaches the box or the feedback; the box's pid 1
    cannot be traced or read (the student's own child can); answers that switch the call
    watcher off and call labkit.theory score 0, because labkit.theory is not in their box.
    A half-right answer fails on hidden inputs drawn for this student, and the feedback
    names those, never another student's."""
    secret = f"grader-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("LABKIT_GRADER_SECRET", secret)
    nb = notebook(root, "exercises", "ps1_numbers")
    set_cell(nb, "global_batch_answer", WRONG_GLOBAL)
    set_cell(nb, "target_lr_answer", PROBE + "\n\n" + HONEST_TARGET)
    set_cell(nb, "adam_gb_answer", WATCHER_OFF)
    set_cell(nb, "bubble_answer", KEY_BUBBLE)
    # a submission may be called anything (issue 25): it is graded as the assignment's notebook
    path = tmp_path / "my copy (1).ipynb"
    nbformat.write(nb, path)
    from labkit.grading.submit import submit

    result = submit("ps1_numbers", [path], student="eve", root=root)
    got = scores(result)
    assert got == {"global_batch": 1, "target_lr": 2, "warmup_lr": 0, "adam_gb_per_gpu": 0,
                   "bubble_share": 0, "ring_bytes": 0, "ring_time": 0}, result.report()
    text, outputs = feedback_text(result), autograded_outputs(root, "eve")
    _only_own_inputs(root, text, "eve", "zoe")
    assert secret not in text and secret not in outputs
    assert str(root) not in outputs.split("ENVIRON", 1)[1].split("\n", 1)[0]
    for path_ in ("/proc/1/environ", "/proc/1/maps", "/proc/1/mem"):
        assert f"{path_} refused: PermissionError" in outputs, outputs
    assert "PTRACE 1: -1 1" in outputs  # EPERM
    assert "PTRACE OWN CHILD: 0" in outputs  # the student's own processes stay theirs
    assert "it calls labkit.theory.zero_memory" in text
    assert "it calls labkit.theory.bubble_fraction" in text


FORK_BOMB = '''import os
while True:
    try:
        os.fork()
    except OSError:
        pass
'''
HUGE = "x = bytearray(30 * 10**9)\n"
FILL_TMP = '''with open("/tmp/fill", "wb") as f:
    while True:
        f.write(bytes(2**20))
'''


def cgroup_leftovers() -> set[str]:
    """Box cgroups whose grader is gone (names are labkit-box-<grader pid>-<random>), where
    this session's graders put them: another session's leftovers are not this test's."""
    return {str(p) for folder in box_parents() for p in folder.glob("labkit-box-*")
            if not Path(f"/proc/{p.name.split('-')[2]}").exists()}


def test_a_fork_bomb_30_gb_and_a_full_tmp_end_in_a_score_and_a_line_each(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three answer cells each run into a limit of the box: each is stopped, its box
    started again without it, a line in the feedback names the limit, and the notebook is
    graded to the end: the honest answers score, the three attacked ones do not."""
    token = f"labkit-limits-{uuid.uuid4().hex}"
    monkeypatch.setenv("LABKIT_TEST_TOKEN", token)
    nb = notebook(root, "exercises", "ps1_numbers")
    set_cell(nb, "global_batch_answer", HONEST_GLOBAL)
    set_cell(nb, "target_lr_answer", HONEST_TARGET)
    set_cell(nb, "warmup_lr_answer", HONEST_WARMUP)
    set_cell(nb, "adam_gb_answer", FORK_BOMB)
    set_cell(nb, "bubble_answer", HUGE)
    set_cell(nb, "ring_answer", FILL_TMP)
    result = grade(root, "ps1_numbers", nb, "oscar", tmp_path, cell_timeout=8,
                   options={"processes": 256, "tmp_mb": 64, "memory_mb": 2048})
    got = scores(result)
    assert got == {"global_batch": 2, "target_lr": 2, "warmup_lr": 2, "adam_gb_per_gpu": 0,
                   "bubble_share": 0, "ring_bytes": 0, "ring_time": 0}, result.report()
    text = feedback_text(result)
    limits = [line for line in text.splitlines() if "labkit grading limit" in line]
    assert any("more than 256 processes and threads at once" in line for line in limits), limits
    assert "more memory than the 2048 MiB a box may use" in text
    assert "a full /tmp (the box's /tmp holds 64 MiB)" in text
    assert processes_holding(token) == []
    assert cgroup_leftovers() == set()


def _only_own_inputs(root: Path, text: str, student: str, other: str) -> None:
    """The feedback names a failed hidden case of ``student``'s and none of ``other``'s."""
    from labkit.grading import instructor

    keys = instructor.load("ps1_numbers", root)
    assert keys is not None
    mine, theirs = keys.cases("global_batch", student), keys.cases("global_batch", other)
    assert [c for c, _ in mine] != [c for c, _ in theirs]

    def shown(case: dict[str, int]) -> str:
        return "global_batch(" + ", ".join(f"{k}={v!r}" for k, v in case.items()) + ")"

    assert shown(next(c for c, _ in mine if c["accumulation"] > 1)) in text
    assert not any(shown(c) in text for c, _ in theirs if c not in [m for m, _ in mine])
