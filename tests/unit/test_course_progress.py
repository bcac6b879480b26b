"""The instructor's long waits count what they finished: ``labkit course traces`` (problem
set 4's timelines, real runs, minutes) a line per trace, ``labkit course release`` (an
nbgrader process per assignment) and ``check`` (a fresh release) a line per assignment, on
stderr where progress is asked for; nothing on stdout (``labkit course grade``'s is in
test_grading_sanitize)."""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.analysis.timeline import Timeline
from labkit.grading import course, traces
from labkit.grading.traces import TraceSpec


def test_recording_traces_counts_them_on_stderr(tmp_path: Path, monkeypatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(traces, "record", lambda spec: Timeline([], spec.world_size))
    specs = {"a": TraceSpec("slow_stage", 1, 2, 0), "b": TraceSpec("slow_link", 0, 2, 1)}
    by_seed = {0: ("slow_stage", 1), 1: ("slow_link", 0)}
    seen = iter(by_seed[s.seed] for s in specs.values())
    report = traces.generate(specs, tmp_path / "public", lambda timeline: next(seen),
                             progress=True)
    assert set(report) == {"a", "b"} and (tmp_path / "public" / "b.json").exists()
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.splitlines() == ["recording traces in public: 1/2 a",
                                    "recording traces in public: 2/2 b"]


def test_releasing_counts_the_assignments_on_stderr(tmp_path: Path, monkeypatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    class Proc:
        returncode, stdout, stderr = 0, "", ""

    ran: list[str] = []
    monkeypatch.setattr(course, "nbgrader", lambda args, root: ran.append(args[1]) or Proc())
    paths = course.release(tmp_path, ["ps1", "ps2"], progress=True)
    assert ran == ["ps1", "ps2"] and paths == [tmp_path / "exercises" / "ps1",
                                               tmp_path / "exercises" / "ps2"]
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.splitlines() == ["releasing: 1/2 ps1", "releasing: 2/2 ps2"]
    course.release(tmp_path, ["ps1"])  # unasked, off a terminal: silent
    assert capsys.readouterr() == ("", "")


def test_checking_the_release_counts_its_fresh_release(tmp_path: Path, monkeypatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """``labkit course check`` releases every assignment again to compare: the same wait."""
    class Proc:
        returncode, stdout, stderr = 0, "", ""

    (tmp_path / course.CONFIG).write_text("")
    for name in ("ps1", "ps2"):
        (tmp_path / "solutions" / name).mkdir(parents=True)
        (tmp_path / "exercises" / name).mkdir(parents=True)
    monkeypatch.setattr(course, "nbgrader", lambda args, root: Proc())
    assert course.stale_assignments(tmp_path, progress=True) == {}
    out = capsys.readouterr()
    assert out.out == "" and out.err.splitlines() == ["releasing: 1/2 ps1", "releasing: 2/2 ps2"]
