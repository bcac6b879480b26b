"""The package students install and the release they get hold no answer key, no hidden input.

Every hidden value the instructor's side defines (ps1's randomised cases and their keys,
ps2's key, ps3's to ps6's secrets and hidden cases as drawn for a student, ps4's hidden
traces) is
looked for, as it would be written, in every file of the installed ``labkit`` package and
of ``exercises/``; the instructor folder itself is not an assignment and never released.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import labkit
from labkit.grading import course, instructor

pytestmark = pytest.mark.lesson08
REPO = Path(__file__).resolve().parents[2]


def shipped_text() -> str:
    files = [p for p in Path(labkit.__file__).parent.rglob("*") if p.is_file()
             and p.suffix in (".py", ".json", ".txt", ".md", ".ipynb")]
    files += [p for p in (REPO / "exercises").rglob("*") if p.is_file()]
    return "\n".join(p.read_text(errors="ignore") for p in files)


def distinctive(value: object) -> list[str]:
    """How a hidden value would appear in a file: long numbers and names, not 2 or 8."""
    if isinstance(value, float):
        short = f"{value:.6g}"
        digits = short.split("e")[0].replace("-", "").replace(".", "").strip("0")
        rare = len(digits) >= 4 and not value.is_integer()
        return [repr(value)] * (len(repr(value)) >= 8) + [short] * rare
    if isinstance(value, str) and len(value) >= 6:
        return [value]
    return []


def hidden_values() -> list[str]:
    ps1 = instructor.load("ps1_numbers", REPO)
    ps3 = instructor.load("ps3_build_it", REPO)
    ps4 = instructor.load("ps4_reasoning", REPO)
    ps5 = instructor.load("ps5_3d", REPO)
    ps6 = instructor.load("ps6_async", REPO)
    ps7 = instructor.load("ps7_planning_at_scale", REPO)
    ps8 = instructor.load("ps8_long_sequences", REPO)
    assert None not in (ps1, ps3, ps4, ps5, ps6, ps7, ps8)
    out = [ps1.SECRET, ps3.SECRET, repr(ps3.pipeline_cases("student")),
           repr(ps3.bucket_sizes("student")), repr(ps3.doubling_sizes("student")),
           repr(ps3.zero_sizes("student")), "def cases(",
           "HIDDEN_CASES", "HIDDEN_SCENARIOS", "HIDDEN_CHALLENGES"]
    for name in ps1.KEYS:
        for _, expected in ps1.cases(name):
            out += distinctive(expected)
    out += [ps4.SECRET, ps5.SECRET, ps6.SECRET]
    for draw in (ps4.hidden_scenarios, ps4.hidden_challenges, ps5.hidden_state,
                 ps5.hidden_layouts, ps6.hidden_stragglers, ps6.hidden_programs,
                 ps6.hidden_gate_cases):  # as drawn for a student
        out.append(repr(list(draw("student").values()) if isinstance(draw("student"), dict)
                        else draw("student")))
    out += [ps7.SECRET, "def state_cases(", "def mfu_cases(", "def grade_plan("]
    out += [ps8.SECRET]
    for path in (instructor.folder(REPO) / "ps4_traces").glob("*.json"):
        events = json.loads(path.read_text())["events"]
        out.append(json.dumps(events[len(events) // 2], separators=(",", ":")))
    return out


def test_no_hidden_value_ships_in_the_package_or_the_release() -> None:
    text = shipped_text()
    found = [v for v in hidden_values() if v in text]
    assert found == [], f"hidden values found in what students get: {found[:5]}"


def test_instructor_folder_is_not_an_assignment() -> None:
    assert instructor.FOLDER not in course.assignments(REPO)
    assert not (REPO / "exercises" / instructor.FOLDER).exists()
