"""nbgrader course configuration for labkit's graded exercises.

Layout (relative to this file's folder, the course root):
  solutions/<assignment>/   source notebooks: solutions, visible and hidden tests (instructor)
  exercises/<assignment>/   the student release, made by `labkit course release`
                            (= `nbgrader generate_assignment --force`), committed
  course/                   ignored: submitted/, autograded/, feedback/, gradebook.db
`labkit submit ASSIGNMENT` runs autograde and generate_feedback against this layout. On a
JupyterHub, nbgrader's exchange works unchanged: release_assignment / collect use the same
course_id and folders.
"""

import os

from nbconvert.preprocessors import ClearMetadataPreprocessor, CSSHTMLHeaderPreprocessor
from nbgrader.preprocessors import (
    AssignLatePenalties,
    CheckCellMetadata,
    ClearOutput,
    DeduplicateIds,
    GetGrades,
    IgnorePattern,
    LimitOutput,
    OverwriteCells,
    OverwriteKernelspec,
    SaveAutoGrades,
)

from labkit.grading.feedback import HideHiddenTests
from labkit.grading.repair import RepairStudentMetadata
from labkit.grading.sandbox.execute import SandboxedExecute
from labkit.grading.sanitize import SanitizeStudentContent

c = get_config()  # noqa: F821 (provided by traitlets when it loads this file)

try:
    _root = os.path.dirname(os.path.abspath(__file__))
except NameError:
    _root = os.getcwd()

c.CourseDirectory.course_id = "labkit"
c.CourseDirectory.root = _root
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "exercises"
c.CourseDirectory.submitted_directory = os.path.join("course", "submitted")
c.CourseDirectory.autograded_directory = os.path.join("course", "autograded")
c.CourseDirectory.feedback_directory = os.path.join("course", "feedback")
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(_root, "course", "gradebook.db")
c.CourseDirectory.assignment_id = ""

# Autograde runs every student cell in a sandbox and the locked test cells in the grader's
# own process (labkit.grading.sandbox): the student's code can neither read solutions/,
# the gradebook or other students' work, nor patch the checks. A student cell gets
# cell_timeout seconds: it only defines functions, so 30 s is generous; one that never
# returns is stopped and the rest of the notebook is still graded. A test cell gets
# test_timeout seconds for everything it runs in the boxes: the slowest (ps3's ring
# all-reduce on 2, 3 and 4 relayed ranks, one box per rank) took 7 s on this 2-core
# machine at load average 2 (bench/bench_grading.py), so 120 s leaves room.
# Each box may run 512 processes and threads, use 4096 MiB and hold 512 MiB in /tmp; a cell
# may use 60 CPU seconds (a test cell 600), the whole notebook 1800 CPU seconds and 1200 s
# of time: a submission whose every cell hangs still ends in a score. sandbox: auto =
# bubblewrap, else unshare, else none. cgroup: '' = boxes' cgroups under the grader's own
# (root); `labkit course hub` sets '/labkit-grading', delegated to the instructor.
# A submission's nbgrader metadata is made the gradebook's before nbgrader validates it (a
# cell claiming schema_version 99 or a grade cell the assignment lacks is repaired or
# ignored, with a note), and what it shows is made inert once it ran (no script, event
# handler, javascript: link or active output reaches the formgrader or the feedback).
c.Autograde.sanitize_preprocessors = [
    RepairStudentMetadata, ClearOutput, DeduplicateIds, OverwriteKernelspec, OverwriteCells,
    CheckCellMetadata]
c.Autograde.autograde_preprocessors = [
    SandboxedExecute, SanitizeStudentContent, IgnorePattern, ClearMetadataPreprocessor,
    LimitOutput, SaveAutoGrades, AssignLatePenalties, CheckCellMetadata]
c.SandboxedExecute.cell_timeout = 30.0
c.SandboxedExecute.test_timeout = 120.0
c.SandboxedExecute.sandbox = "auto"
# `nbgrader validate` (a student checking a notebook by hand) still uses nbgrader's kernel.
c.Execute.timeout = 120
c.Execute.kernel_name = "python3"

# A deleted test cell is put back (and run); an edited locked cell gets its original source
# back. nbgrader logs both ("Missing grade cell", "checksum ... has changed"); labkit submit
# reports them as tampering.
c.OverwriteCells.add_missing_cells = True

# Feedback: scores per cell, never the hidden tests' source, no active content (again, for
# notebooks autograded before labkit sanitized them). The HTML exporter (feedback and the
# formgrader) also cleans markdown and HTML as it renders them.
c.GenerateFeedback.preprocessors = [GetGrades, HideHiddenTests, SanitizeStudentContent,
                                    CSSHTMLHeaderPreprocessor]
c.HTMLExporter.sanitize_html = True
