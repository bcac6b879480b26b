"""An ipywidgets viewer for a run's timeline: pick the steps and the ranks, see the Gantt.

The figure itself comes from ``labkit.analysis.plots.plot_timeline``; this module only wires
controls to it, so the viewer works wherever the plain figure does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from labkit.analysis.plots import plot_timeline

if TYPE_CHECKING:
    from labkit.analysis.timeline import Timeline


def timeline_viewer(timeline: Timeline) -> Any:
    """Step range slider + "show labels" toggle + the timeline figure, redrawn on change."""
    import ipywidgets as w
    from IPython.display import display

    steps = timeline.steps() or [0]
    first, last = steps[0], steps[-1]
    window = w.IntRangeSlider(value=(min(first + 1, last), min(first + 2, last)), min=first,
                              max=last, description="steps", continuous_update=False)
    labels = w.Checkbox(value=True, description="labels")
    prev_btn = w.Button(description="◀ step", layout=w.Layout(width="80px"))
    next_btn = w.Button(description="step ▶", layout=w.Layout(width="80px"))
    out = w.Output()
    stats = w.HTML()

    def redraw(*_: Any) -> None:
        lo, hi = window.value
        chosen = list(range(lo, hi + 1))
        sub = timeline.window(chosen)
        stats.value = (f"<b>steps {lo}–{hi}</b>: compute {sub.compute_s()*1e3:.2f} ms, "
                       f"comm {sub.comm_s()*1e3:.2f} ms per rank (mean), overlap "
                       f"{sub.overlap_fraction():.0%}, idle {sub.bubble_fraction():.0%}")
        out.clear_output(wait=True)
        with out:
            display(plot_timeline(timeline, steps=chosen, labels=labels.value))

    def shift(delta: int) -> None:
        lo, hi = window.value
        if first <= lo + delta and hi + delta <= last:
            window.value = (lo + delta, hi + delta)

    window.observe(redraw, "value")
    labels.observe(redraw, "value")
    prev_btn.on_click(lambda _b: shift(-1))
    next_btn.on_click(lambda _b: shift(+1))
    redraw()
    return w.VBox([w.HBox([window, prev_btn, next_btn, labels]), stats, out])
