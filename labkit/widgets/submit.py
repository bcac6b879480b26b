"""A "Submit for grading" button for exercise notebooks (calls ``labkit.grading.submit``).

The button grades the notebook file as it is ON DISK, so the panel asks the student to
save first (Ctrl+S). The result shows the score per question and a link to the feedback
HTML. Creating the panel does nothing else, so nbgrader can run the cell while grading.
"""

from __future__ import annotations

import html
from pathlib import Path

import ipywidgets as widgets

from labkit.grading.submit import SubmitResult, submit


class SubmitPanel:
    """Button + status area; ``button.click()`` works in tests."""

    def __init__(self, assignment: str, notebook: str | Path | None = None,
                 student: str = "student"):
        self.assignment, self.notebook, self.student = assignment, notebook, student
        self.button = widgets.Button(description="Submit for grading", icon="check",
                                     button_style="primary")
        self.status = widgets.HTML("Save the notebook first (Ctrl+S): the saved file is graded.")
        self.result: SubmitResult | None = None
        self.button.on_click(self._on_click)
        self.widget = widgets.VBox([self.button, self.status])

    def _on_click(self, _button: object) -> None:
        self.button.disabled = True
        self.status.value = "Grading... (code exercises start real ranks; this takes a minute)"
        try:
            self.result = submit(self.assignment, [self.notebook] if self.notebook else None,
                                 student=self.student, on_progress=self._progress)
            self.status.value = render(self.result)
        except Exception as exc:  # noqa: BLE001 (any failure of student code is feedback)
            self.status.value = f"<b>Could not grade:</b> <pre>{html.escape(str(exc))}</pre>"
        finally:
            self.button.disabled = False

    def _progress(self, line: str) -> None:
        """What nbgrader is grading now, under the button (``submit``'s progress lines)."""
        self.status.value = f"Grading... <code>{html.escape(line.strip())}</code>"


def render(result: SubmitResult) -> str:
    """The result as an HTML table with the feedback link."""
    rows = "".join(f"<tr><td>{html.escape(q.grade_id)}</td><td>{q.score:g} / {q.max_score:g}"
                   "</td></tr>" for q in result.questions)
    warn = "".join(f"<p><b>Tampering:</b> {html.escape(t)}</p>" for t in result.tampered)
    links = "".join(f'<p>Feedback: <a href="{html.escape(str(p))}" target="_blank">'
                    f"{html.escape(str(p))}</a></p>" for p in result.feedback_html)
    return (f"<table><tr><th>question</th><th>score</th></tr>{rows}<tr><td><b>total</b></td>"
            f"<td><b>{result.score:g} / {result.max_score:g}</b></td></tr></table>{warn}{links}")


def submit_button(assignment: str, notebook: str | Path | None = None) -> widgets.VBox:
    """The widget to show at the end of an exercise notebook."""
    return SubmitPanel(assignment, notebook).widget
