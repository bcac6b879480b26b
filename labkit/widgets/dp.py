"""Widgets of the data-parallelism lesson (needs a live kernel; the figures do not).

* ``ring_stepper``: step forward and back through a recorded ring all-reduce.
* ``train_step_widget``: the "Train Step" visualizer (seed 001): each click advances one
  phase of a real recorded step — forward, local gradients, all-reduce, averaged
  gradients, optimizer step — with the real per-rank numbers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ipywidgets as w

from labkit.visuals.dp import plot_train_step
from labkit.visuals.ring_anim import plot_ring_state

TRAIN_PHASES = (
    "forward: each rank runs the same model on its own shard",
    "backward: local gradients differ because the data differ",
    "all-reduce: gradients are summed over ranks and divided by n",
    "after all-reduce: every rank holds the identical averaged gradient",
    "optimizer step: identical update, the replicas stay in sync",
)


def ring_stepper(record: Mapping[str, Any]) -> w.VBox:
    """A slider (with play button) over the stages of a recorded ring all-reduce."""
    stages = len(record["values"][0])
    slider = w.IntSlider(value=0, min=0, max=stages - 1, description="stage")
    play = w.Play(value=0, min=0, max=stages - 1, interval=1200)
    w.jslink((play, "value"), (slider, "value"))
    out = w.Output()

    def show(change: Any = None) -> None:
        out.clear_output(wait=True)
        with out:
            from IPython.display import display

            display(plot_ring_state(dict(record), slider.value))

    slider.observe(show, names="value")
    show()
    return w.VBox([w.HBox([play, slider]), out])


def phase_text(records: Sequence[Mapping[str, Any]], phase: int) -> str:
    """What the recorded step shows at ``phase`` (0..4), with its real numbers."""
    recs = sorted(records, key=lambda r: r["rank"])
    head = f"<b>{phase + 1}. {TRAIN_PHASES[phase]}</b><br>"
    rows = []
    for r in recs:
        if phase == 0:
            rows.append(f"rank {r['rank']}: samples {r['samples'][:6]}..., loss {r['loss']:.4f}")
        elif phase in (1, 2):
            rows.append(f"rank {r['rank']}: |grad| of {r['param_names'][0]} = "
                        f"{r['grad_norms_local'][0]:.4f}")
        elif phase == 3:
            rows.append(f"rank {r['rank']}: |grad| of {r['param_names'][0]} = "
                        f"{r['grad_norms_synced'][0]:.4f}")
        else:
            rows.append(f"rank {r['rank']}: |Δw| of {r['param_names'][0]} = "
                        f"{r['update_norms'][0]:.6f}")
    return head + "<br>".join(rows)


def train_step_widget(records: Sequence[Mapping[str, Any]]) -> w.VBox:
    """Click "Train Step" to walk through one recorded data-parallel step phase by phase."""
    state = {"phase": -1}
    button = w.Button(description="Train Step", button_style="primary")
    text = w.HTML("Click <b>Train Step</b> to replay the recorded step.")
    out = w.Output()

    def advance(_b: Any = None) -> None:
        state["phase"] = (state["phase"] + 1) % len(TRAIN_PHASES)
        text.value = phase_text(records, state["phase"])
        if state["phase"] == len(TRAIN_PHASES) - 1:
            out.clear_output(wait=True)
            with out:
                from IPython.display import display

                display(plot_train_step(records))

    button.on_click(advance)
    return w.VBox([button, text, out])
