"""Attacks on the grader itself, as a student would try them, in one crafted ps1 notebook.

Every attack issue 18 lists is in it: patching ``Verdict`` (and the new ``Question``),
walking up the stack to the grader's expected value, reading ``solutions/`` and the
instructor's hidden inputs, deleting another assignment's source, editing
``nbgrader_config.py``, a detached process that rewrites ``course/gradebook.db`` seconds
later, looking for hidden values in the installed package, answering by calling
``labkit.theory``, and two cells that never return (one ignores Ctrl-C). Next to them sit
two honest answers and one that comes after the hung cells: the notebook must score
exactly those, leave every instructor file as it was, and leave no process behind.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from pathlib import Path

import nbformat
import pytest

from tests.conftest import processes_holding
from tests.grading.test_nbgrader_flow import feedback_text, grade, notebook, root, scores, set_cell

pytestmark = [pytest.mark.grading, pytest.mark.lesson08]
__all__ = ["root"]  # the session's course copy, shared with the flow tests

HONEST_GLOBAL = ("def global_batch_size(gpus, per_gpu_batch, accumulation):\n"
                 "    return gpus * per_gpu_batch * accumulation\n")
PATCH_THE_GRADER = '''import labkit.grading.checks as checks
import labkit.grading.parts as parts
checks.Verdict.require = lambda self: self
parts.Question.score = lambda self: self.points
parts.Question.earned = property(lambda self: self.points)

def target_lr(base_lr, base_batch, gpus, per_gpu_batch, accumulation):
    raise NotImplementedError()
'''
WALK_THE_STACK = '''import sys

def warmup_lr(target_lr, step, warmup_steps):
    frame = sys._getframe(1)
    while frame is not None:
        if "expected" in frame.f_locals:
            return frame.f_locals["expected"]
        frame = frame.f_back
    return -1.0
'''
CALL_THE_KEY = '''from labkit import theory

def adam_gb_per_gpu(params, gpus, zero_stage):
    return theory.zero_memory(params, gpus, zero_stage)["total"] / 1e9
'''
HONEST_BUBBLE = ("def bubble_share(stages, microbatches):\n"
                 "    return (stages - 1) / (microbatches + stages - 1)\n")
HONEST_RING = '''def ring_bytes(size_bytes, world_size):
    return 2 * (world_size - 1) / world_size * size_bytes


def ring_time(size_bytes, world_size, alpha_s, bandwidth_Bps):
    return 2 * (world_size - 1) * alpha_s + ring_bytes(size_bytes, world_size) / bandwidth_Bps
'''


def attack_cell(root: Path) -> str:
    """Reads, deletes, edits and schedules a late write to instructor files; prints what it saw."""
    return f'''import os, subprocess, sys, labkit
ROOT = {str(root)!r}
seen = {{}}
for path in ("solutions/ps1_numbers/ps1_numbers.ipynb", "solutions/_grading/ps1_numbers.py",
             "nbgrader_config.py", "course/gradebook.db", "course/submitted"):
    try:
        full = os.path.join(ROOT, path)
        seen[path] = os.listdir(full) if os.path.isdir(full) else open(full, "rb").read()[:50]
    except OSError as exc:
        seen[path] = type(exc).__name__
for action in (lambda: __import__("shutil").rmtree(os.path.join(ROOT, "solutions/ps2_planning")),
               lambda: open(os.path.join(ROOT, "nbgrader_config.py"), "a").write("c.X = 1\\n")):
    try:
        action()
    except OSError as exc:
        print("blocked:", type(exc).__name__)
# a detached process that outlives this cell and rewrites the gradebook later
later = ("import time, sqlite3; time.sleep(4); "
         f"db = sqlite3.connect({{os.path.join(ROOT, 'course/gradebook.db')!r}}); "
         "db.execute('update grade set auto_score = max_score'); db.commit()")
subprocess.Popen([sys.executable, "-c", later], start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
# hidden inputs in the installed package?
package = os.path.dirname(labkit.__file__)
hits = [os.path.join(d, f) for d, _, files in os.walk(package) for f in files
        if "_grading" in d or f == "ps1_numbers.py" or (f.endswith(".py") and "def cases("
                                                         in open(os.path.join(d, f)).read())]
print("SEEN", {{k: (v if isinstance(v, str) else "READ") for k, v in seen.items()}})
print("HIDDEN IN PACKAGE", hits)
'''


def tree_digest(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(path)).encode() + p.read_bytes())
    return h.hexdigest()


def autograded_outputs(root: Path, student: str) -> str:
    nb = nbformat.read(root / "course/autograded" / student / "ps1_numbers/ps1_numbers.ipynb",
                       as_version=4)
    return "\n".join(str(o.get("text", "")) + str(o.get("evalue", ""))
                     for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def test_attacks_score_only_the_honest_parts_and_touch_no_instructor_file(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = f"labkit-attack-{uuid.uuid4().hex}"
    monkeypatch.setenv("LABKIT_TEST_TOKEN", token)
    before = {"solutions": tree_digest(root / "solutions"),
              "config": (root / "nbgrader_config.py").read_bytes()}
    nb = notebook(root, "exercises", "ps1_numbers")
    set_cell(nb, "global_batch_answer", HONEST_GLOBAL)
    set_cell(nb, "target_lr_answer", PATCH_THE_GRADER)
    set_cell(nb, "warmup_lr_answer", WALK_THE_STACK)
    set_cell(nb, "adam_gb_answer", CALL_THE_KEY + "\n" + attack_cell(root))
    set_cell(nb, "bubble_answer", HONEST_BUBBLE)
    hang = nbformat.v4.new_code_cell("while True:\n    pass")
    stubborn = nbformat.v4.new_code_cell(
        "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n"
        "    time.sleep(0.1)")
    at = next(i for i, c in enumerate(nb.cells)
              if c.metadata.get("nbgrader", {}).get("grade_id") == "ring_answer")
    nb.cells[at:at] = [hang, stubborn]
    set_cell(nb, "ring_answer", HONEST_RING)
    result = grade(root, "ps1_numbers", nb, "mallory", tmp_path / "m", cell_timeout=6)
    got = scores(result)
    assert got == {"global_batch": 2, "target_lr": 0, "warmup_lr": 0, "adam_gb_per_gpu": 0,
                   "bubble_share": 2, "ring_bytes": 1, "ring_time": 2}, result.report()
    assert len(result.stopped) == 2, result.report()  # both hung cells, stopped and reported
    text = feedback_text(result)
    assert "it calls labkit.theory.zero_memory" in text and "do that work yourself" in text
    outputs = autograded_outputs(root, "mallory")
    # nothing of the instructor's side exists in the box; nothing was deleted or edited
    assert "'READ'" not in outputs.split("SEEN", 1)[1].split("\n", 1)[0], outputs
    assert "HIDDEN IN PACKAGE []" in outputs
    secret = grader_secret(root)
    assert secret not in text and secret not in outputs and "grader.cases" not in text
    time.sleep(6)  # longer than the detached writer waited
    assert tree_digest(root / "solutions") == before["solutions"]
    assert (root / "nbgrader_config.py").read_bytes() == before["config"]
    # the late writer would have set every grade in the gradebook to full marks
    assert submit_scores(root, "mallory") == got, "the gradebook was rewritten after grading"
    leftovers = processes_holding(token)
    assert leftovers == [], f"processes outlived grading: {leftovers}"


def grader_secret(root: Path) -> str:
    from labkit.grading import instructor

    module = instructor.load("ps1_numbers", root)
    assert module is not None
    return str(module.SECRET)


def submit_scores(root: Path, student: str) -> dict[str, float]:
    from labkit.grading.submit import _scores

    return {q.grade_id: q.score for q in _scores(root, "ps1_numbers", student)}
