"""Lesson 10's DDP rows judged (``labkit.lessons.cluster_ddp``): weak scaling's efficiency is
at most 1 and the step across a link is the in-node step plus what the link adds, each from
the runs' own steps; a row whose steps swing is inconclusive, an efficiency above 1 beyond its
noise is contradicted, and a miss says its replay (or why there is none) and why it missed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from labkit.analysis.timeline import Timeline
from labkit.base.events import Event, Lane, Op
from labkit.lessons import cluster_ddp
from labkit.lessons.machine import Load

MS = 1_000_000


def _run(steps_ms: list[float], ranks: int = 2) -> Any:
    """A run whose steps (step spans only, no CPU times: nothing to replay) last ``steps_ms``."""
    events, t = [], 0
    for s, ms in enumerate(steps_ms):
        events += [Event(r, Lane.STEP, Op.STEP, t, int(ms * MS), step=s) for r in range(ranks)]
        t += int(ms * MS) + MS
    return SimpleNamespace(timeline=Timeline(events, ranks))


def _ddp(inside: list[float], across: list[float], predicted_ms: float) -> dict[str, Any]:
    results = {"1 rank": _run([30, 10, 10, 10], 1), "1 node x 2 ranks": _run(inside),
               "2 nodes x 1 rank, ethernet_25g": _run(across)}
    rows = [{"name": "1 rank", "step_s": 0.01},
            {"name": "1 node x 2 ranks", "step_s": min(inside[1:]) / 1e3},
            {"name": "2 nodes x 1 rank, ethernet_25g", "step_s": min(across[1:]) / 1e3,
             "predicted_step_s": predicted_ms / 1e3},
            {"name": "2 nodes x 1 rank, infiniband_hdr", "step_s": None, "predicted_step_s": 0.02}]
    return {"rows": rows, "results": results}


@pytest.fixture(autouse=True)
def quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster_ddp, "load_now", lambda: Load(0.1, 2))


def test_steady_rows_hold_both_rules() -> None:
    ddp = _ddp([40, 11, 11.2, 11.4], [90, 50, 51, 52], predicted_ms=45)
    weak, pred = cluster_ddp.weak_scaling_verdicts(ddp), cluster_ddp.prediction_verdicts(ddp)
    assert [v.word for v in weak + pred] == ["holds"] * 3  # the unmeasured row is not judged
    assert "1 node x 2 ranks: efficiency t(1 rank) / t 0.91 +- 0.02" in weak[0].sentence()
    assert "ethernet_25g: step (ms, the fastest) 50.0 +- 1.0" in pred[0].sentence()
    text = cluster_ddp.ddp_text(ddp)
    assert text.count("-- holds") == 3 and "replay" not in text


def test_an_efficiency_above_one_is_never_held_and_a_miss_says_why() -> None:
    ddp = _ddp([40, 7, 7.1, 7.2], [90, 50, 80, 110], predicted_ms=20)
    weak, pred = cluster_ddp.weak_scaling_verdicts(ddp), cluster_ddp.prediction_verdicts(ddp)
    assert weak[0].word == "contradicted"  # 1.43 +- 0.02: a speedup weak scaling cannot give
    assert weak[1].word == "holds" and pred[0].word == "inconclusive"  # 50 +- 30 ms vs 13-30
    text = cluster_ddp.ddp_text(ddp)
    assert "-- contradicted by this run" in text and "inconclusive on this machine" in text
    assert text.count("no dedicated-core replay") == 2 and "a core" in text


def test_nothing_measured_says_so() -> None:
    ddp = {"rows": [{"name": "1 rank", "step_s": 0.01}], "results": {"1 rank": _run([10, 10], 1)}}
    assert cluster_ddp.weak_scaling_verdicts(ddp) == []
    assert "nothing to judge" in cluster_ddp.ddp_text(ddp)


def test_a_step_under_its_no_overlap_prediction_says_what_the_backward_hid() -> None:
    ddp = _ddp([40, 11, 11.2, 11.4], [90, 20, 26, 27], predicted_ms=30)
    ddp["rows"][2].update(comm_s=0.012, exposed_s=0.005)
    (pred,) = cluster_ddp.prediction_verdicts(ddp)
    assert pred.word == "inconclusive"  # 20 +- 3.5 ms against 20-45
    text = cluster_ddp.ddp_text(ddp)
    assert "this run hid 7.0 ms of its 12.0 ms under the backward (its trace)" in text
    over = _ddp([40, 11, 11.2, 11.4], [90, 50, 80, 110], predicted_ms=20)
    over["rows"][2].update(comm_s=0.012, exposed_s=0.005)
    assert "under the backward" not in cluster_ddp.ddp_text(over)  # above it: not overlap
