"""``labkit.visuals.replay.plot_replay``: the figure a lesson draws beside a missed verdict
shows each run's median step -- the step whose time the sentence beside it quotes
(``Timeline.median_step_s``) -- never simply the last step (issue 32, item 3)."""

from __future__ import annotations

from labkit.analysis.replay import MODEL_LABEL, replay
from labkit.analysis.timeline import Timeline
from labkit.base.events import Event, Op
from labkit.visuals.replay import median_step, plot_replay

MS = 1_000_000


def one_rank(step_ms: list[float], cpu_share: float = 1.0) -> Timeline:
    """One rank: each step a forward of ``step_ms[s]`` wall time, ``cpu_share`` of it CPU."""
    events, t = [], 0.0
    for s, d in enumerate(step_ms):
        events.append(Event(0, Op.STEP.lane, Op.STEP, int(t * MS), int(d * MS), step=s))
        events.append(Event(0, Op.FORWARD.lane, Op.FORWARD, int(t * MS), int(d * MS), step=s,
                            cpu_ns=int(d * cpu_share * MS)))
        t += d
    return Timeline(events, 1)


def test_the_median_step_skips_the_warm_up_and_is_a_step_that_ran() -> None:
    assert median_step(one_rank([50, 3, 9, 5, 20])) == 3  # 3 5 9 20: the shorter middle one
    assert median_step(one_rank([50, 3, 9, 5])) == 3  # 3 5 9
    assert median_step(one_rank([7])) == 0  # only the warm-up: it is the run
    assert median_step(Timeline([], 1)) is None


def test_the_figure_draws_the_median_step_not_the_last() -> None:
    """Steps of 3, 9, 5 and 20 ms after the warm-up: the sentence quotes the median (7 ms,
    between 5 and 9); the figure draws step 3 (5 ms), where the old choice drew step 4, the
    20 ms the load made. The replay (half of each step was CPU) draws its own median step."""
    run = one_rank([50, 3, 9, 5, 20], cpu_share=0.5)
    fig = plot_replay(run, replay(run))
    top, bottom = (ax.get_title(loc="left") for ax in fig.axes)
    assert top.startswith("measured on this machine (the median step, 3): 5.0 ms"), top
    assert bottom.startswith(f"{MODEL_LABEL} (the median step, 3): 2.5 ms"), bottom
    drawn = [len(ax.patches) + len(ax.collections) for ax in fig.axes]
    assert all(n > 0 for n in drawn), drawn


def test_named_steps_are_drawn_in_both_panels() -> None:
    run = one_rank([50, 3, 9, 5, 20])
    fig = plot_replay(run, replay(run), steps=[4])
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert titles[0] == "measured on this machine (step 4): 20.0 ms", titles
    assert titles[1] == f"{MODEL_LABEL} (step 4): 20.0 ms", titles
