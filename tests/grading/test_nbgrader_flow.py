"""The whole nbgrader flow, end to end, on a temporary copy of the course.

Release -> submit the solutions (full marks) -> submit the released stubs (zero) -> submit
crafted wrong answers (partial marks per part, feedback that says what to try) -> submit
tampered notebooks (edited / deleted locked test cells are caught and graded as the
original) -> submit code-exercise cheats (a private all-reduce, labkit's own 1F1B plan).
Feedback never shows hidden test source, and grading leaves no rank process behind.
The attacks on the grader itself are in ``test_grading_attacks.py``.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path

import nbformat
import pytest

from labkit.grading.submit import SubmitResult, submit
from tests.conftest import processes_holding

pytestmark = [pytest.mark.grading, pytest.mark.lesson08]
REPO = Path(__file__).resolve().parents[2]
ASSIGNMENTS = ("ps1_numbers", "ps2_planning", "ps3_build_it", "ps4_reasoning", "ps5_3d",
               "ps6_async", "ps7_planning_at_scale", "ps8_long_sequences")


@pytest.fixture(scope="session")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private course root: config, solutions (with instructor data) and the release."""
    path = tmp_path_factory.mktemp("course")
    shutil.copy(REPO / "nbgrader_config.py", path / "nbgrader_config.py")
    shutil.copytree(REPO / "solutions", path / "solutions")
    shutil.copytree(REPO / "exercises", path / "exercises")
    return path


def notebook(root: Path, where: str, name: str) -> nbformat.NotebookNode:
    return nbformat.read(root / where / name / f"{name}.ipynb", as_version=4)


def set_cell(nb: nbformat.NotebookNode, grade_id: str, source: str | None) -> None:
    """Replace the source of the cell with ``grade_id`` (None: delete the cell)."""
    for i, cell in enumerate(nb.cells):
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            if source is None:
                del nb.cells[i]
            else:
                cell.source = source
            return
    raise KeyError(grade_id)


def hidden_lines(nb: nbformat.NotebookNode) -> list[str]:
    """The lines inside BEGIN/END HIDDEN TESTS regions of the source notebook."""
    out, inside = [], False
    for cell in nb.cells:
        for line in cell.source.splitlines():
            if "BEGIN HIDDEN TESTS" in line or "END HIDDEN TESTS" in line:
                inside = "BEGIN" in line
            elif inside and line.strip():
                out.append(line.strip())
    return out


def grade(root: Path, name: str, nb: nbformat.NotebookNode, student: str,
          tmp_path: Path, **options: object) -> SubmitResult:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"{name}.ipynb"
    nbformat.write(nb, path)
    return submit(name, [path], student=student, root=root, **options)  # type: ignore[arg-type]


def scores(result: SubmitResult) -> dict[str, float]:
    return {q.grade_id: q.score for q in result.questions}


def feedback_text(result: SubmitResult) -> str:
    html = result.feedback_html[0].read_text()
    return re.sub(r"<[^>]+>", "", html).replace("&quot;", '"').replace("&#39;", "'")


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_solutions_get_full_marks(root: Path, name: str, tmp_path: Path) -> None:
    result = grade(root, name, notebook(root, "solutions", name), "solver", tmp_path)
    assert result.max_score > 0
    assert result.score == result.max_score, result.report()
    assert result.tampered == [] and result.stopped == []
    assert result.sandbox in ("bwrap", "unshare", "none")
    assert result.feedback_html and result.feedback_html[0].exists()


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_released_stubs_get_zero_and_feedback_hides_hidden_tests(root: Path, name: str,
                                                                  tmp_path: Path) -> None:
    result = grade(root, name, notebook(root, "exercises", name), "stub", tmp_path)
    assert result.score == 0, result.report()
    text = feedback_text(result)
    assert "BEGIN HIDDEN TESTS" not in text and "grader." not in text
    for line in hidden_lines(notebook(root, "solutions", name)):
        assert line not in text, f"hidden test line shown in feedback: {line}"


def test_wrong_answers_get_partial_marks_and_tampering_is_caught(root: Path,
                                                                 tmp_path: Path) -> None:
    """ps1: wrong formulas, a hard-coded answer, a half-right one, tampered test cells."""
    nb = notebook(root, "solutions", "ps1_numbers")
    set_cell(nb, "bubble_answer", "def bubble_share(stages, microbatches):\n"
             "    return (stages - 1) / microbatches\n")
    set_cell(nb, "global_batch_answer", "def global_batch_size(gpus, per_gpu_batch, "
             "accumulation):\n    return 1024 if per_gpu_batch == 32 else 512\n")
    # right during warmup, forgets to stop at the target afterwards: one part of two
    set_cell(nb, "warmup_lr_answer", "def warmup_lr(target_lr, step, warmup_steps):\n"
             "    return target_lr * step / warmup_steps\n")
    # stubs whose locked tests the "student" disabled or deleted
    set_cell(nb, "ring_answer", "def ring_bytes(size_bytes, world_size):\n    return 0\n\n"
             "def ring_time(size_bytes, world_size, alpha_s, bandwidth_Bps):\n    return 0\n")
    set_cell(nb, "ring_bytes", "pass  # nothing to see here")
    set_cell(nb, "ring_time", None)
    result = grade(root, "ps1_numbers", nb, "wrong", tmp_path)
    got = scores(result)
    assert got["bubble_share"] == 0 and got["global_batch"] == 0
    assert got["ring_bytes"] == 0 and got["ring_time"] == 0
    assert got["warmup_lr"] == 1, result.report()
    assert got["target_lr"] == 2 and got["adam_gb_per_gpu"] == 3
    text = feedback_text(result)
    assert "Try: the pipeline runs m + p - 1 slots" in text
    assert "[failed] after warmup" in text and "[ok] during warmup" in text
    assert "global_batch(gpus=" in text  # the hidden variant that failed, by its inputs
    tampered = " ".join(result.tampered)
    assert "ring_bytes was edited" in tampered and "ring_time was deleted" in tampered


ZERO_DOUBLING = """    n, rank = ctx.world_size, ctx.rank
    distance = 1
    while distance < n:
        handle = ctx.comm.isend(torch.zeros_like(tensor), rank ^ distance)
        ctx.comm.recv(torch.empty_like(tensor), rank ^ distance)
        handle.wait()
        distance *= 2
"""
"""The body of exactly recursive doubling's sends, carrying zeros: the cover for a sum found
elsewhere."""
PRIVATE_ALLREDUCE = '''def doubling_all_reduce(ctx, tensor):
    """Issue 26's attack: the sum from a hidden all-reduce (the process group itself, else
    one of its own on a file store, as labkit's ranks meet), behind recursive doubling's sends."""
    import datetime
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _get_default_group
    try:
        _get_default_group().allreduce([tensor]).wait()
    except Exception as exc:
        print("no process group:", exc)
        try:
            dist.init_process_group("gloo", init_method="file:///tmp/hidden-store",
                                    rank=ctx.rank, world_size=ctx.world_size,
                                    timeout=datetime.timedelta(seconds=3))
            dist.all_reduce(tensor)
        except Exception as exc:
            print("no way around the relay:", type(exc).__name__)
''' + ZERO_DOUBLING + "    return tensor\n"


def test_code_exercises_catch_cheats_and_leave_no_processes(root: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """ps3: a hidden all-reduce behind doubling-shaped zero sends (each rank is a box of its own
    with no process group and no shared /tmp: there is nothing to all-reduce with, and the
    relay saw that the sends carried zeros), and labkit's own 1F1B plan (labkit.schedules is
    absent from the box that runs it), both score 0 with a message; the honest answers
    keep their marks."""
    token = f"labkit-grading-{uuid.uuid4().hex}"
    monkeypatch.setenv("LABKIT_TEST_TOKEN", token)
    nb = notebook(root, "solutions", "ps3_build_it")
    set_cell(nb, "doubling_answer", PRIVATE_ALLREDUCE)
    set_cell(nb, "one_f_one_b_answer", "def one_f_one_b(stages, microbatches):\n"
             "    from labkit.schedules import build_plan\n"
             "    plan = build_plan('1f1b', stages, microbatches)\n"
             "    return {r: [str(a) for a in plan.actions(r)] for r in range(stages)}\n")
    result = grade(root, "ps3_build_it", nb, "cheat", tmp_path)
    got = scores(result)
    assert got["doubling_allreduce"] == 0 and got["one_f_one_b"] == 0, result.report()
    assert got["accumulated_sync"] == 3 and got["zero_adam"] == 3, result.report()
    text = feedback_text(result)
    assert "is not a chunk of a sum of the ranks' tensors" in text
    assert "it calls labkit.schedules" in text and "do that work yourself" in text
    leftovers = processes_holding(token)
    assert leftovers == [], f"processes left behind by grading: {leftovers}"
    assert os.environ["LABKIT_TEST_TOKEN"] == token


def test_a_students_copy_without_solutions_still_grades_as_practice(tmp_path: Path) -> None:
    """`labkit submit` in a copy with no solutions/: the visible tests run in the box, the
    hidden ones cannot, and the report says it is a practice score."""
    copy = tmp_path / "student-copy"
    copy.mkdir()
    shutil.copy(REPO / "nbgrader_config.py", copy / "nbgrader_config.py")
    shutil.copytree(REPO / "exercises", copy / "exercises")
    answers = {c.metadata["nbgrader"]["grade_id"]: c.source
               for c in notebook(REPO, "solutions", "ps1_numbers").cells
               if c.metadata.get("nbgrader", {}).get("solution")}
    nb = notebook(copy, "exercises", "ps1_numbers")
    for gid, source in answers.items():
        set_cell(nb, gid, "\n".join(line for line in source.splitlines()
                                    if "### BEGIN SOLUTION" not in line
                                    and "### END SOLUTION" not in line))
    result = grade(copy, "ps1_numbers", nb, "me", tmp_path / "nb")
    assert result.practice and "practice score" in result.report()
    assert 0 < result.score < result.max_score, result.report()  # hidden-only parts: not yet
    assert "[checked at grading]" in feedback_text(result)
