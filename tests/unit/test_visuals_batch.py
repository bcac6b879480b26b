"""Figures of lessons 02 and 07 return matplotlib Figures carrying the recorded data."""

from __future__ import annotations

import math

import pytest
from matplotlib.figure import Figure

from labkit.lessons.scaling import CurveRun
from labkit.visuals.batch import plot_loss_curves, plot_lr_schedule
from labkit.visuals.faults import FaultStory, plot_fault_timeline

pytestmark = [pytest.mark.lesson02]


def _run(name: str, losses: list[float], batch: int) -> CurveRun:
    return CurveRun(name=name, world_size=1, global_batch=batch, lr=0.1, losses=losses,
                    lrs=[0.1] * len(losses), grad_norms=[1.0] * len(losses), wall_s=0.0)


def test_loss_curves_one_line_per_run_and_divergence_marked() -> None:
    runs = {"1 rank": _run("1 rank", [2.3, 2.0, 1.5, 1.0], 16),
            "4 ranks": _run("4 ranks", [2.3, 1.2], 32),
            "too large": _run("too large", [2.3, 50.0, math.nan], 16)}
    fig = plot_loss_curves(runs)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == list(runs)
    first = ax.lines[0]
    assert list(first.get_xdata()) == [16, 32, 48, 64]
    assert list(first.get_ydata()) == [2.3, 2.0, 1.5, 1.0]
    assert any(t.get_text() == "diverged" for t in ax.texts)


def test_lr_schedule_marks_the_worked_example() -> None:
    fig = plot_lr_schedule(measured=[0.0, 0.000008, 0.000016])
    ax = fig.axes[0]
    line = ax.lines[0]
    assert len(line.get_xdata()) == 1000
    assert line.get_ydata()[250] == pytest.approx(0.002)
    assert line.get_ydata()[999] == pytest.approx(0.004)
    assert any("step 250: LR 0.002" in t.get_text() for t in ax.texts)
    assert list(ax.lines[1].get_ydata()) == [0.0, 0.000008, 0.000016]


@pytest.mark.lesson07
def test_fault_timeline_shows_kill_checkpoints_and_resume() -> None:
    story = FaultStory(steps=12, fault_rank=1, fault_step=9, checkpoints=[4, 8], resumed_from=8,
                       reference_losses=[2.0] * 12, resumed_losses=[2.0] * 12)
    assert story.lost_steps == 1
    fig = plot_fault_timeline(story)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "rank 1 killed at step 9" in labels
    assert "resumed from checkpoint at step 8" in labels
    assert "redone: 1 step" in labels
    only_top = plot_fault_timeline(FaultStory(steps=6, fault_rank=0, fault_step=2,
                                              checkpoints=[], resumed_from=0))
    assert len(only_top.axes) == 1


def test_fault_story_takes_rank_and_step_from_the_failed_runs_timeline(tmp_path) -> None:
    """The dead rank from the error, the step from the steps it finished (aborted ones do
    not count); checkpoints after that step belong to the second attempt."""
    from labkit.analysis.timeline import Timeline
    from labkit.base.errors import ConfigError, RankFailure, RunFailed
    from labkit.base.events import Event, Lane, Op
    from labkit.train.checkpoint import MARKER
    from labkit.visuals.faults import story_from_runs

    for step in (4, 8, 12):  # committed checkpoints, as the saver leaves them
        (tmp_path / f"step_{step:08d}").mkdir()
        (tmp_path / f"step_{step:08d}" / ".metadata").write_text("{}")
        (tmp_path / f"step_{step:08d}" / MARKER).write_text("")
    events = [Event(r, Lane.STEP, Op.STEP, 10 * s, 5, step=s) for r in (0, 1) for s in range(9)]
    events.append(Event(0, Lane.STEP, Op.STEP, 90, 5, step=9, name="aborted"))
    err = RunFailed(RankFailure(1, "signal", "rank 1 was killed by SIGKILL"))
    err.timeline = Timeline(events, 2)
    story = story_from_runs(checkpoint_dir=str(tmp_path), steps=12, resumed_from=8, failed=err)
    assert (story.fault_rank, story.fault_step, story.lost_steps) == (1, 9, 1)
    assert story.checkpoints == [4, 8]  # step 12 was written by the second attempt
    by_spec = story_from_runs(checkpoint_dir=str(tmp_path), steps=12, resumed_from=8,
                              fault="0:5:kill")
    assert (by_spec.fault_rank, by_spec.fault_step) == (0, 5)
    with pytest.raises(ConfigError, match="failed=<the RunFailed"):
        story_from_runs(checkpoint_dir=str(tmp_path), steps=12, resumed_from=8)
