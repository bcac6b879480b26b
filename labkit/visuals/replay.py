"""The measured run above, the same run replayed on dedicated cores below, on one time scale
(``labkit.lessons.dedicated``): where the two differ, the machine's load made the difference,
not the algorithm. The replay's title says it is a model built from the run."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from labkit.analysis.replay import Replay


def plot_replay(result: Any, rep: Replay, steps: Iterable[int] | None = None) -> Figure:
    """Two timelines: ``result``'s as measured, and ``rep`` (its dedicated-core replay)."""
    from labkit.analysis.plots import plot_timelines
    from labkit.analysis.replay import MODEL_LABEL

    timeline = getattr(result, "timeline", result)
    chosen = list(steps) if steps is not None else timeline.steps()[-1:]
    measured, modelled = timeline.window(chosen), rep.timeline.window(chosen)
    return plot_timelines({
        f"measured on this machine (step {chosen[0]}): {measured.median_step_s(False) * 1e3:.1f} ms":
            measured,
        f"{MODEL_LABEL}: {modelled.median_step_s(False) * 1e3:.1f} ms": modelled})
