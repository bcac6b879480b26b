"""The measured run above, the same run replayed on dedicated cores below, on one time scale
(``labkit.lessons.dedicated``): where the two differ, the machine's load made the difference,
not the algorithm. The replay's title says it is a model built from the run.

Each panel draws its run's *median* step (the warm-up skipped, ``median_step``): the step
whose time the lesson's sentence quotes (``Timeline.median_step_s``), not the last one, which
on a busy machine may be the step the load stretched most."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from labkit.analysis.replay import Replay
    from labkit.analysis.timeline import Timeline


def median_step(timeline: Timeline) -> int | None:
    """The step whose time is the median of ``timeline``'s step times, the first (warm-up)
    skipped as ``Timeline.median_step_s`` skips it; of an even count, the shorter of the two
    middle steps (a step that ran). None for a timeline without steps."""
    steps, times = timeline.steps(), timeline.step_times_s()
    pairs = sorted(zip(times[1:], steps[1:]) if len(steps) > 1 else zip(times, steps))
    return pairs[(len(pairs) - 1) // 2][1] if pairs else None


def plot_replay(result: Any, rep: Replay, steps: Iterable[int] | None = None) -> Figure:
    """Two timelines: ``result``'s as measured, and ``rep`` (its dedicated-core replay), each
    at its median step (``median_step``) unless ``steps`` names the steps to draw in both."""
    from labkit.analysis.plots import plot_timelines
    from labkit.analysis.replay import MODEL_LABEL

    timeline = getattr(result, "timeline", result)
    panels = {}
    for label, tl in (("measured on this machine", timeline), (MODEL_LABEL, rep.timeline)):
        mid = median_step(tl)
        chosen = list(steps) if steps is not None else ([] if mid is None else [mid])
        window = tl.window(chosen)
        which = (f"the median step, {chosen[0]}" if steps is None and chosen
                 else f"step {chosen[0]}" if chosen else "no step")
        panels[f"{label} ({which}): {window.median_step_s(False) * 1e3:.1f} ms"] = window
    return plot_timelines(panels)
