"""``SandboxedExecute``: nbgrader's autograde step, with student code boxed and checks outside.

It replaces nbgrader's ``Execute`` in ``c.Autograde.autograde_preprocessors`` and walks the
notebook in order:

1. a cell is *the instructor's* only if its ``grade_id`` is a locked cell in the gradebook
   and its source is the gradebook's (nbgrader's ``OverwriteCells`` has already put locked
   cells back); every other code cell is the student's;
2. student cells run in the box (:class:`~labkit.grading.sandbox.remote.Session`), each
   under ``cell_timeout`` seconds and the box's limits (processes, memory, ``/tmp``, CPU
   time per cell and per notebook: :class:`~labkit.grading.sandbox.limits.Limits`); a
   cell that hangs or runs into a limit is stopped, a line in its output says which
   limit, and the notebook goes on;
3. locked setup cells (imports) run in the box and in the grader's namespace;
4. locked test cells run only in the grader's own interpreter, with the student's names
   brought over as plain values or as proxies that call into the box, plus ``grader``:
   the instructor-only data of ``solutions/_grading/<assignment>.py``, and
   ``student_id``: the student being graded, which seeds that student's hidden inputs.
   So a student can neither patch the checks nor read the expected values: they are
   never in the box.

The outputs written back (printed feedback, the score ``q.score()`` returns as
``execute_result``, errors) are what nbgrader grades and ``generate_feedback`` renders.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import io
import time
from pathlib import Path
from typing import Any

from nbformat import NotebookNode
from nbformat.v4 import new_output
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Float, Integer, Unicode

from labkit.grading.sandbox.limits import Limits
from labkit.grading.sandbox.remote import RemoteFunction, Session

MISSING_PREFIX = "# This cell (id:"


def _trusted_cells(info: dict[str, Any]) -> tuple[dict[str, str], set[str]]:
    """grade_id -> source of every locked cell, and the ids of the test (grade) cells."""
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(info["db_url"]) as gb:
        try:
            nb = gb.find_notebook(info["notebook"], info["assignment"])
        except MissingEntry:
            return {}, set()
        locked = {c.name: c.source for c in nb.source_cells if c.locked}
        solutions = {c.name for c in nb.solution_cells}
        tests = {c.name for c in nb.grade_cells if c.cell_type == "code"} - solutions
    return locked, tests


def _is_trusted(cell: NotebookNode, locked: dict[str, str]) -> bool:
    gid = cell.metadata.get("nbgrader", {}).get("grade_id")
    if gid not in locked:
        return False
    source, want = cell.source, locked[gid]
    if source == want:
        return True
    # a deleted test cell nbgrader put back: a comment line, a blank line, then the source
    return source.startswith(MISSING_PREFIX) and source.split("\n", 2)[-1] == want


def free_names(source: str) -> set[str]:
    """Names a cell reads but never assigns (what it expects to exist already)."""
    tree = ast.parse(source)
    loaded: set[str] = set()
    stored: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else stored).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            stored.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            stored.update((a.asname or a.name).split(".")[0] for a in node.names)
    return loaded - stored - set(dir(builtins))


GAP = "labkit grading gap: "
"""Every line about a part the hidden tests never reached starts so (not a limit's ``NOTE``:
nothing of the student's was stopped)."""


def unreached_parts(ns: dict[str, Any], before: list[Any] | None = None) -> list[str]:
    """A line for each scored part of a question in ``ns`` (not one of ``before``, the values
    an earlier cell left there) that the hidden tests never reached.

    Such a part earns nothing, yet the answer was not at fault: the grader's draws for this
    student missed it. The line goes into the cell's output (the student's feedback) and the
    instructor's log, so a gap in a key is seen, not read as a wrong answer.
    """
    from labkit.grading.parts import Question

    old = {id(value) for value in before or ()}  # ``before`` holds them: no id is reused
    return [f"{GAP}no hidden case reached part '{part.label}' of {value.name}: that is a gap "
            "in the grader, not in your answer; tell your instructor."
            for value in ns.values() if isinstance(value, Question) and id(value) not in old
            for part in value.parts.values() if not part.ran and not part.gate]


def run_in_grader(source: str, ns: dict[str, Any]) -> list[NotebookNode]:
    """Execute instructor code in the grader's namespace; outputs as nbformat outputs."""
    out = io.StringIO()
    outputs: list[NotebookNode] = []
    value: Any = None
    try:
        tree = ast.parse(source)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        assert last is None or isinstance(last, ast.Expr)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            exec(compile(tree, "<test>", "exec"), ns)
            if last is not None:
                value = eval(compile(ast.Expression(last.value), "<test>", "eval"), ns)
    except BaseException as exc:  # noqa: BLE001 (a failed check is the cell's error output)
        if out.getvalue():
            outputs.append(new_output("stream", name="stdout", text=out.getvalue()))
        name, text = type(exc).__name__, str(exc)
        outputs.append(new_output("error", ename=name, evalue=text,
                                  traceback=[f"{name}: {text}"]))
        return outputs
    if out.getvalue():
        outputs.append(new_output("stream", name="stdout", text=out.getvalue()))
    if value is not None:
        outputs.append(new_output("execute_result", data={"text/plain": repr(value)},
                                  execution_count=None))
    return outputs


def box_outputs(reply: dict[str, Any]) -> list[NotebookNode]:
    """A student cell's reply from the box as nbformat outputs."""
    outputs = []
    for name in ("stdout", "stderr"):
        if reply.get(name):
            outputs.append(new_output("stream", name=name, text=reply[name]))
    if "result" in reply:
        outputs.append(new_output("execute_result", data={"text/plain": reply["result"]},
                                  execution_count=None))
    if "error" in reply:
        err = reply["error"]
        trace = [line for line in str(err.get("traceback", "")).split("\n") if line] or \
            [f"{err.get('ename')}: {err.get('evalue')}"]
        outputs.append(new_output("error", ename=str(err.get("ename", "Error")),
                                  evalue=str(err.get("evalue", "")), traceback=trace))
    return outputs


class SandboxedExecute(NbGraderPreprocessor):  # type: ignore[misc]
    """Execute a submission: student cells in a box, locked test cells in the grader."""

    cell_timeout = Float(30.0, help="Seconds a student cell may run before it is "
                         "stopped (the rest of the notebook is still graded).").tag(config=True)
    test_timeout = Float(120.0, help="Seconds one locked test cell may spend in the boxes in "
                         "all (its calls of the student's functions and the real-rank "
                         "runs it starts).").tag(config=True)
    sandbox = Unicode("auto", help="auto, bwrap, unshare or none (see "
                      "labkit.grading.sandbox.box).").tag(config=True)
    max_file_bytes = Integer(50 * 2**20, help="Data files larger than this (in all) are "
                             "not copied into the box.").tag(config=True)
    processes = Integer(512, help="Processes and threads one box may run at once.").tag(
        config=True)
    memory_mb = Integer(4096, help="MiB of memory one box may use (all its processes; "
                        "each process alone too).").tag(config=True)
    tmp_mb = Integer(512, help="MiB the box's /tmp (and /dev/shm) may hold.").tag(config=True)
    cell_cpu_s = Float(60.0, help="CPU seconds one student cell may use.").tag(config=True)
    test_cpu_s = Float(600.0, help="CPU seconds one test cell may use in the boxes.").tag(
        config=True)
    notebook_cpu_s = Float(1800.0, help="CPU seconds the whole notebook may use in its "
                           "boxes; later cells are not run.").tag(config=True)
    notebook_timeout = Float(1200.0, help="Wall seconds the whole notebook's box work may "
                             "take; later cells are not run.").tag(config=True)
    cgroup = Unicode("", help="Where boxes make their cgroups: '' = under the grader's own "
                     "cgroup, '/labkit-grading' = that folder of each hierarchy (what "
                     "`labkit course hub` delegates to the instructor).").tag(config=True)

    def limits(self) -> Limits:
        return Limits(processes=self.processes, memory_mb=self.memory_mb, tmp_mb=self.tmp_mb,
                      cell_cpu_s=self.cell_cpu_s, test_cpu_s=self.test_cpu_s,
                      notebook_cpu_s=self.notebook_cpu_s, notebook_timeout=self.notebook_timeout)

    def _files(self, folder: Path) -> dict[str, bytes]:
        """The submission's data files (never notebooks) to recreate inside the box."""
        files: dict[str, bytes] = {}
        total = 0
        for path in sorted(folder.rglob("*")):
            if not path.is_file() or path.suffix == ".ipynb" or ".ipynb_checkpoints" in path.parts:
                continue
            size = path.stat().st_size
            if total + size > self.max_file_bytes:
                self.log.warning("not copying %s into the box (size limit)", path)
                continue
            files[str(path.relative_to(folder))] = path.read_bytes()
            total += size
        return files

    def preprocess(self, nb: NotebookNode, resources: dict[str, Any]
                   ) -> tuple[NotebookNode, dict[str, Any]]:
        from nbgrader.coursedir import CourseDirectory

        from labkit.grading import instructor

        info = resources["nbgrader"]
        coursedir = CourseDirectory(parent=self)
        root = Path(coursedir.root)
        locked, tests = _trusted_cells(info)
        folder = Path(resources.get("metadata", {}).get("path") or ".").resolve()
        session = Session(mode=self.sandbox, course_root=root, files=self._files(folder),
                          cell_timeout=self.cell_timeout, limits=self.limits(),
                          cgroup_parent=self.cgroup or None)
        ns: dict[str, Any] = {"__name__": "__grader__", "student_id": str(info["student"]),
                              "grader": instructor.load(info["assignment"], root,
                                                        coursedir.source_directory)}
        try:
            session.start()
            held = "a cgroup" if session.box is not None and session.box.cgroup else "rlimits"
            self.log.info("grading %s in a '%s' sandbox, limits held by %s", info["notebook"],
                          session.mode_used, held)
            count, total = 0, sum(cell.cell_type == "code" for cell in nb.cells)
            for cell in nb.cells:
                if cell.cell_type != "code":
                    continue
                count += 1
                cell.execution_count = count
                trusted = _is_trusted(cell, locked)
                gid = cell.metadata.get("nbgrader", {}).get("grade_id")
                # labkit submit shows this line as its progress (labkit.grading.submit_progress)
                self.log.info("grading cell %d of %d (%s, %s)", count, total, gid or "-",
                              "test" if trusted and gid in tests else "box")
                start = time.monotonic()
                if trusted and gid in tests:
                    with contextlib.chdir(folder):  # the notebook's relative paths (data)
                        cell.outputs = self._test(cell.source, ns, session)
                else:
                    cell.outputs = box_outputs(session.run_cell(cell.source))
                    if trusted:  # a locked setup cell: the grader needs its imports too
                        with contextlib.chdir(folder):
                            run_in_grader(cell.source, ns)
                for note in session.notes:  # which limit stopped something in this cell
                    cell.outputs.append(new_output("stream", name="stderr", text=note + "\n"))
                    self.log.warning("cell %d (%s): %s", count, gid or "-", note)
                # bench/bench_grading.py reads these lines to size the time limits
                self.log.info("cell %d (%s, %s): %.2f s", count, gid or "-",
                              "test" if trusted and gid in tests else "box",
                              time.monotonic() - start)
            resources.setdefault("labkit", {})["sandbox"] = session.mode_used
            resources["labkit"]["box_restarts"] = session.restarts
        finally:
            session.close()
        return nb, resources

    def _test(self, source: str, ns: dict[str, Any], session: Session) -> list[NotebookNode]:
        session.begin_test(self.test_timeout)
        fetched: set[str] = ns.setdefault("__student_names__", set())
        for name in fetched:  # fetch the student's names afresh for every test cell
            ns.pop(name, None)
        fetched.clear()
        try:
            for name in sorted(free_names(source) - set(ns)):
                fetched.add(name)
                try:
                    kind, value = session.describe(name)
                except Exception:  # noqa: BLE001 (a name the box cannot describe stays unset)
                    continue
                if kind == "callable":
                    ns[name] = RemoteFunction(session, name)
                elif kind == "value":
                    ns[name] = value
            before = list(ns.values())
            outputs = run_in_grader(source, ns)
        finally:
            session.end_test()
        for gap in unreached_parts(ns, before):
            outputs.append(new_output("stream", name="stderr", text=gap + "\n"))
            self.log.warning("%s", gap)
        return outputs
