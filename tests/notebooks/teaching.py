"""How a lesson teaches, read from its cells (issue 33, DESIGN.md "the mechanism is on the page").

A lesson marks its teaching cells in cell metadata, under ``"labkit"``:

* ``{"mechanism": NAME, "break": [OLD, NEW]}`` on the editable code cell that implements
  what the lesson teaches (15-40 lines, at least one ``def``). ``OLD -> NEW`` is an edit a
  student could make that breaks the mechanism without crashing it (a ``+=`` made ``=``,
  a neighbour off by one): the tests apply it and check the comparison says so.
* ``{"checks": NAME}`` on the cell after it that runs the mechanism on real ranks and prints
  ``labkit.lessons.mechanism.compare(...)`` against labkit's own implementation.
* ``{"predict": VAR}`` on a prompt cell holding ``VAR = None`` under a ``# Predict`` comment;
  a later cell passes ``VAR`` to ``reveal(...)``.
* ``{"closing_check": true}`` on the markdown cell that ends the lesson: 3-5 questions whose
  answers open on click (``<details>``) and the ``labkit submit`` line of its problem set.

``parts(nb)`` reads them (the static test checks every lesson has them); ``break_mechanisms``
runs, in the lesson's own kernel after its last cell, each mechanism with its break applied and
then its check, and fails unless the comparison printed the mismatch.
"""

from __future__ import annotations

import contextlib
import io
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
NOT_A_LESSON = {"08_quick_test"}
"""The quick test is the quiz itself: no mechanism, predictions or closing check of its own."""


@dataclass
class Parts:
    """A lesson's teaching cells, by kind (indices into ``nb.cells``)."""

    mechanisms: dict[str, int] = field(default_factory=dict)
    checks: dict[str, int] = field(default_factory=dict)
    predictions: dict[str, int] = field(default_factory=dict)
    closing: list[int] = field(default_factory=list)


def _meta(cell: Any) -> dict[str, Any]:
    return dict(cell.get("metadata", {}).get("labkit", {}))


def parts(nb: Any) -> Parts:
    found = Parts()
    for n, cell in enumerate(nb.cells):
        meta = _meta(cell)
        if "mechanism" in meta:
            found.mechanisms[meta["mechanism"]] = n
        if "checks" in meta:
            found.checks[meta["checks"]] = n
        if "predict" in meta:
            found.predictions[meta["predict"]] = n
        if meta.get("closing_check"):
            found.closing.append(n)
    return found


def problems(stem: str, nb: Any) -> list[str]:
    """What the lesson's teaching cells lack, in words (empty when it has them all)."""
    if stem in NOT_A_LESSON:
        return []
    found, cells, out = parts(nb), nb.cells, []
    if not found.mechanisms:
        out.append("no mechanism cell (metadata labkit.mechanism)")
    for name, n in found.mechanisms.items():
        src, meta = cells[n].source, _meta(cells[n])
        lines = [ln for ln in src.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        if cells[n].cell_type != "code" or "def " not in src or not 10 <= len(lines) <= 40:
            out.append(f"mechanism {name!r}: a code cell of 10-40 lines with a def "
                       f"({len(lines)} code lines)")
        old_new = meta.get("break")
        if not (isinstance(old_new, list) and len(old_new) == 2 and old_new[0] in src
                and old_new[0] != old_new[1]):
            out.append(f"mechanism {name!r}: labkit.break must be [OLD, NEW] with OLD in the cell")
        check = found.checks.get(name)
        if check is None or check <= n or "compare(" not in cells[check].source:
            out.append(f"mechanism {name!r}: no later cell (labkit.checks) prints compare(...)")
    if len(found.predictions) < 2:
        out.append(f"{len(found.predictions)} predict-then-reveal prompts, at least 2 wanted")
    for var, n in found.predictions.items():
        src = cells[n].source
        if not re.search(rf"^{re.escape(var)} = None\b", src, re.M) or "Predict" not in src:
            out.append(f"prompt {var!r}: the cell must say '# Predict ...' and hold {var} = None")
        if not any(f"reveal({var}" in c.source for c in cells[n + 1:] if c.cell_type == "code"):
            out.append(f"prompt {var!r}: no later cell reveals it (reveal({var}, ...))")
    if not found.closing:
        out.append("no closing check (a markdown cell with labkit.closing_check)")
    for n in found.closing:
        text = cells[n].source
        qs = text.count("<details>")
        if cells[n].cell_type != "markdown" or not 3 <= qs <= 5 or "labkit submit ps" not in text:
            out.append(f"closing check: 3-5 <details> answers ({qs}) and a 'labkit submit ps...' line")
    return out


def break_mechanisms(stem: str, ns: dict[str, Any]) -> str:
    """Run each mechanism with its break applied, then its check, in the lesson's kernel;
    fail unless the comparison printed the mismatch. Returns what it did, for the output."""
    import nbformat

    from labkit.lessons.mechanism import MISMATCH

    nb = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4)
    found = parts(nb)
    said = []
    for name, n in found.mechanisms.items():
        old, new = _meta(nb.cells[n])["break"]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(_python(nb.cells[n].source.replace(old, new, 1)), ns)
            exec(_python(nb.cells[found.checks[name]].source), ns)
        printed = out.getvalue()
        assert MISMATCH in printed, (f"{stem}: mechanism {name!r} broken on purpose ({old!r} -> "
                                     f"{new!r}), yet its comparison printed: {printed[-600:]!r}")
        said.append(name)
    return f"broken on purpose, the comparison said so: {', '.join(said)}" if said else ""


def _python(source: str) -> str:
    """A cell's source as plain Python (IPython's magics transformed)."""
    from IPython.core.inputtransformer2 import TransformerManager

    return str(TransformerManager().transform_cell(source))
