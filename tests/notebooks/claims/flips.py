"""Two runs of the lessons beside the same load must say the same words (issue 32).

A timed verdict may be "inconclusive" on a busy machine; what it must never do is say
"holds" in one run and "contradicted" in the next, since a student who runs the cell twice
would then read the rule as true and false. ``claims.verdicts.log_verdicts`` appends every
verdict a lesson judged to the file named by ``LABKIT_VERDICT_LOG``; ``flips`` compares two
such logs, verdict by verdict (the lesson, what it judged, and which of that name it is).

The suite keeps the logs of its last two runs beside hogs (``LABKIT_TEST_HOGS=2``) in
``artifacts/verdicts/`` and fails the second if a verdict flipped (``tests/conftest.py``).
By hand::

    python -m tests.notebooks.claims.flips artifacts/verdicts/hogs-before.jsonl \\
        artifacts/verdicts/hogs-last.jsonl
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.analysis.claims import CONTRADICTED, HOLDS

Key = tuple[str, str, int]
"""(lesson, what the verdict judged, its index among that lesson's verdicts of that name)."""


def keyed(rows: Iterable[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    """A log's rows by ``Key``; a lesson checked twice in one log keeps its last check."""
    by_lesson: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_lesson.setdefault(row["lesson"], []).append(row)
    out: dict[Key, dict[str, Any]] = {}
    for lesson, lesson_rows in by_lesson.items():
        seen: dict[str, int] = {}
        for row in lesson_rows:
            k = seen[row["what"]] = seen.get(row["what"], -1) + 1
            out[(lesson, row["what"], k)] = row
    return out


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """The rows of one log (empty where there is no file)."""
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line]


@dataclass(frozen=True)
class Comparison:
    """Two logs, verdict by verdict."""

    compared: int
    """Verdicts present in both logs."""
    flipped: tuple[str, ...]
    """One line for each verdict that said "holds" in one log and "contradicted" in the other."""
    changed: tuple[str, ...]
    """One line for each other change of word (to or from "inconclusive"): allowed, listed."""
    only_one: tuple[str, ...]
    """Verdicts in one log only (a lesson not run in both, or a verdict renamed)."""


def flips(first: Sequence[dict[str, Any]], second: Sequence[dict[str, Any]]) -> Comparison:
    """Compare two logs; see ``Comparison``."""
    a, b = keyed(first), keyed(second)
    lessons = {k[0] for k in a} & {k[0] for k in b}
    flipped: list[str] = []
    changed: list[str] = []
    for key in sorted(a.keys() & b.keys()):
        x, y = a[key], b[key]
        if x["word"] == y["word"]:
            continue
        line = (f"{key[0]}: {key[1]}: {x['word']} ({x['value']:.3g} +- {x['noise']:.2g}, "
                f"{x['load']}) then {y['word']} ({y['value']:.3g} +- {y['noise']:.2g}, "
                f"{y['load']})")
        (flipped if {x["word"], y["word"]} == {HOLDS, CONTRADICTED} else changed).append(line)
    only = sorted(f"{k[0]}: {k[1]}" for k in a.keys() ^ b.keys() if k[0] in lessons)
    return Comparison(len(a.keys() & b.keys()), tuple(flipped), tuple(changed), tuple(only))


def report(c: Comparison) -> str:
    """``c`` in lines, for the terminal."""
    lines = [f"{c.compared} timed verdicts in both runs; {len(c.flipped)} flipped between "
             f"holds and contradicted, {len(c.changed)} changed to or from inconclusive"]
    lines += [f"  FLIPPED {x}" for x in c.flipped] + [f"  changed {x}" for x in c.changed]
    lines += [f"  in one run only: {x}" for x in c.only_one]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m tests.notebooks.claims.flips FIRST.jsonl SECOND.jsonl")
        return 2
    c = flips(read_log(args[0]), read_log(args[1]))
    print(report(c))
    return 1 if c.flipped else 0


if __name__ == "__main__":
    raise SystemExit(main())
