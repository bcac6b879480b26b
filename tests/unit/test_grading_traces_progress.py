"""``labkit course traces`` records problem set 4's timelines with real runs (minutes): one
line per trace recorded on stderr where progress is asked for, nothing on stdout."""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.analysis.timeline import Timeline
from labkit.grading import traces
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
