"""Seed 001's "Train Step" on real data: the story of one DDP step read from its trace, its
animated drawing, and the widget that runs a step per click (on a stand-in runner here; the
real pool is exercised by tests/distributed/test_pool.py and the browser test)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import matplotlib

matplotlib.use("Agg")

import pytest

from labkit.analysis.timeline import Timeline
from labkit.base.errors import RankFailure, RunFailed
from labkit.base.events import Event, Lane, Op
from labkit.visuals.dp_step import CAPTIONS, play_clock, step_story, train_step_svg

pytestmark = pytest.mark.lesson01

MS = 1_000_000


def _step_events(step: int) -> list[Event]:
    """Two ranks, one step: forward, backward with two buckets launched inside it, a wait,
    the update (times in ms from the step's start at 100 ms)."""
    t = 100 * MS
    ev = []
    for rank in range(2):
        ev += [Event(rank, Lane.STEP, Op.STEP, t, 20 * MS, step=step),
               Event(rank, Lane.COMPUTE, Op.FORWARD, t + 1 * MS, 2 * MS, step=step),
               Event(rank, Lane.COMPUTE, Op.BACKWARD, t + 3 * MS, 8 * MS, step=step),
               Event(rank, Lane.COMM, Op.ALL_REDUCE, t + 5 * MS, 6 * MS, step=step, bucket=0,
                     bytes=1000),
               Event(rank, Lane.COMM, Op.ALL_REDUCE, t + 10 * MS, 6 * MS, step=step, bucket=1,
                     bytes=4000),
               Event(rank, Lane.COMM, Op.WAIT, t + 11 * MS, 5 * MS, step=step, bucket=1),
               Event(rank, Lane.COMPUTE, Op.OPTIMIZER, t + 17 * MS, 1 * MS, step=step)]
    return ev


def _records(step: int, same: bool = True) -> list[dict[str, Any]]:
    return [{"rank": r, "step": step, "loss": 2.3 + r / 10, "param_names": ["0.weight"],
             "grad_norms_local": [0.0265 + r / 100], "grad_norms_synced": [0.0197],
             "update_norms": [0.001], "params_sha256": "ab" * 32 if same or r == 0 else "cd" * 32}
            for r in range(2)]


def test_story_cuts_the_step_into_the_five_phases() -> None:
    """Phases follow the events: forward to the first backward, backward to its end, the
    last all-reduce to the update, the update, then the replicas equal."""
    story = step_story(Timeline(_step_events(3), 2), _records(3))
    assert story.step == 3 and story.duration_ns == 20 * MS
    assert [(a // MS, b // MS) for _, a, b in story.phases] == [(0, 3), (3, 11), (11, 17),
                                                               (17, 18), (18, 20)]
    assert [c for c, _, _ in story.phases] == list(CAPTIONS)
    assert story.buckets == [0, 1] and story.replicas_equal
    assert not step_story(Timeline(_step_events(3), 2), _records(3, same=False)).replicas_equal
    with pytest.raises(ValueError, match="no events of step 4"):
        step_story(Timeline(_step_events(3), 2), _records(4))


def test_playback_slows_down_short_phases_only() -> None:
    """Proportional time inside a phase; a phase shorter than the minimum is stretched to
    it; the clock never runs backwards."""
    story = step_story(Timeline(_step_events(0), 2), _records(0))
    clock = play_clock(story, duration_s=10.0, min_phase_s=1.0)
    # backward is 8 of 20 ms -> 4 s of playback; the 1 ms update is stretched to 1 s
    assert clock(11 * MS) - clock(3 * MS) == pytest.approx(4.0)
    assert clock(18 * MS) - clock(17 * MS) == pytest.approx(1.0)
    samples = [clock(t * MS / 4) for t in range(0, 81)]
    assert samples == sorted(samples)


def test_svg_draws_every_span_and_each_bucket_in_flight() -> None:
    """One growing bar per recorded span, one travelling packet per all-reduce, the captions
    and the hashes; two drawings never share CSS names (both can be on one page)."""
    story = step_story(Timeline(_step_events(0), 2), _records(0))
    svg = train_step_svg(story)
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert svg.count('class="bar"') == len(story.spans) == 12
    assert svg.count('class="pkt"') == 4 and ">b1<" in svg
    assert "the replicas are equal again" in svg and "identical" in svg
    other = train_step_svg(story)
    assert svg.split('class="')[1][:10] != other.split('class="')[1][:10]


class FakeDDPRunner:
    """Stands in for a pool: answers ``run(**kw)`` with a result shaped like labkit.run's."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def run(self, **kw: Any) -> Any:
        self.calls.append(kw)
        last = kw["steps"] - 1
        recs = _records(last)
        return SimpleNamespace(timeline=Timeline(_step_events(last), 2), losses=[2.35],
                               outputs=[SimpleNamespace(extra={"train_step": r}) for r in recs])


def test_train_step_widget_runs_a_step_per_click() -> None:
    """Each click runs one more step on the runner it was given and replays that step: the
    animation names the step's buckets, the table shows the ranks' own numbers."""
    from labkit.widgets.dp import TrainStepPanel

    runner = FakeDDPRunner()
    panel = TrainStepPanel(runner)
    assert panel.figure.widget.children == (panel.figure.placeholder,)  # before any click
    assert "Train Step" in panel.figure.placeholder.value
    panel.button.click()
    panel.button.click()
    assert [c["steps"] for c in runner.calls] == [2, 3]  # step 0 warms up, unshown
    assert runner.calls[0]["strategy"] == "ddp-bucketed" and runner.calls[0]["world_size"] == 2
    assert "step 2:" in panel.status.value and ">b1<" in panel.stage.value
    assert "0.0265" in panel.numbers.value and "identical" in panel.stage.value
    assert "(step 2)" in panel.figure.figure.axes[0].get_title()  # plot_train_step of it
    assert bytes(panel.figure.image.value).startswith(b"\x89PNG")
    assert panel.figure.widget.children == (panel.figure.image,)
    panel.reset_button.click()
    assert panel.stage.value == "" and panel.replay_button.disabled
    assert bytes(panel.figure.image.value) == b""
    assert panel.figure.widget.children == (panel.figure.placeholder,)  # never a broken image
    panel.button.click()
    assert runner.calls[-1]["steps"] == 2


def test_train_step_widget_shows_a_failed_run() -> None:
    """A run that fails is shown in the widget, never raised out of the click."""
    from labkit.widgets.dp import TrainStepPanel

    class Failing:
        def run(self, **kw: object) -> object:
            raise RunFailed(RankFailure(1, "exception", "RuntimeError: boom"))

    panel = TrainStepPanel(Failing())
    panel.button.click()
    assert "the run failed" in panel.status.value and "boom" in panel.status.value
    assert panel.steps == 0


def test_bucket_labels_travel_in_rows_of_their_own() -> None:
    """Every bucket's travelling label sits in its own row, as tall as the label: two
    buckets launched at the same moment never draw their labels over each other."""
    import re

    from labkit.visuals.dp_step import step_story, train_step_svg

    story = step_story(Timeline(_step_events(2), 2), _records(2))
    svg = train_step_svg(story)
    boxes = [(float(x), float(y), float(h)) for x, y, h in re.findall(
        r'<g class="pkt"[^>]*><rect x="([-\d.]+)" y="([-\d.]+)" width="24" height="([\d.]+)"',
        svg)]
    assert len(boxes) >= 2
    for i, (x1, y1, h1) in enumerate(boxes):
        for x2, y2, h2 in boxes[i + 1:]:
            overlap_x = abs(x1 - x2) < 24
            overlap_y = y1 < y2 + h2 and y2 < y1 + h1
            assert not (overlap_x and overlap_y), (boxes, "labels overlap")
