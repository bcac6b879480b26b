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

from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
from nbgrader.preprocessors import GetGrades

from labkit.grading.feedback import HideHiddenTests

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

# Code exercises start real ranks (process start-up, a 60 s supervisor timeout per launch):
# give every cell room, and a whole notebook a bounded time.
c.Execute.timeout = 600
c.ExecutePreprocessor.timeout = 600
c.Execute.kernel_name = "python3"

# A deleted test cell is put back (and run); an edited locked cell gets its original source
# back. nbgrader logs both ("Missing grade cell", "checksum ... has changed"); labkit submit
# reports them as tampering.
c.OverwriteCells.add_missing_cells = True

# Feedback: scores per cell, never the hidden tests' source.
c.GenerateFeedback.preprocessors = [GetGrades, HideHiddenTests, CSSHTMLHeaderPreprocessor]
