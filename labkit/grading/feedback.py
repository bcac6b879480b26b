"""Feedback that never shows hidden tests (an nbconvert preprocessor for generate_feedback).

nbgrader's autograde puts the hidden tests back into each test cell so they run, and its
stock ``generate_feedback`` renders that notebook as HTML: the hidden test source, and the
traceback lines quoting it, would reach the student. ``HideHiddenTests`` runs on the
feedback copy only: it cuts every ``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS``
region from the source and shortens every error in such a cell to its last line, which is
the check's own feedback (``AssertionError: <what to try>``). ``nbgrader_config.py``
installs it in ``GenerateFeedback.preprocessors``.
"""

from __future__ import annotations

from typing import Any

from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

BEGIN, END = "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"
PLACEHOLDER = "# (hidden tests ran here; their source is not shown)"


def strip_hidden(source: str) -> tuple[str, bool]:
    """``source`` without hidden-test regions, and whether any was removed."""
    kept: list[str] = []
    inside = removed = False
    for line in source.split("\n"):
        if BEGIN in line:
            inside = removed = True
            kept.append(line[: len(line) - len(line.lstrip())] + PLACEHOLDER)
        elif END in line:
            inside = False
        elif not inside:
            kept.append(line)
    return "\n".join(kept), removed


class HideHiddenTests(Preprocessor):  # type: ignore[misc]
    """Remove hidden-test source and the tracebacks that quote it from feedback."""

    enabled = Bool(True).tag(config=True)  # nbconvert preprocessors default to off

    def preprocess_cell(self, cell: Any, resources: Any, index: int) -> tuple[Any, Any]:
        if cell.cell_type != "code":
            return cell, resources
        cell.source, removed = strip_hidden(cell.source)
        if removed:
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error":
                    out["traceback"] = [f"{out.get('ename', 'Error')}: {out.get('evalue', '')}"]
        return cell, resources
