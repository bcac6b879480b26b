"""Widgets of the data-parallelism lesson (they need a live kernel; the figures do not).

* ``train_step_widget``: seed 001's "Train Step" visualizer, on real ranks. Each click
  trains the seeded model one step further on the kernel's warm pool (click k trains steps
  0..k from the same seed, which the pool makes a fraction of a second, and which is
  exactly the run that continued one step) and replays step k from its trace
  (``labkit.visuals.dp_step``): forward on each rank, backward with the buckets leaving
  for the wire, the last all-reduces, the update, and the replicas' parameter hashes equal
  again; below, the ranks' own numbers and ``plot_train_step`` of that step.
* ``ring_stepper``: step forward and back through a recorded ring all-reduce.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ipywidgets as w
from IPython.display import display

from labkit.visuals.dp import plot_train_step
from labkit.visuals.ring_anim import plot_ring_state
from labkit.widgets.live import FigureView, timed_run, warm_runner


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
            display(plot_ring_state(dict(record), slider.value))

    slider.observe(show, names="value")
    show()
    return w.VBox([w.HBox([play, slider]), out])


class TrainStepPanel:
    """The controls and views of the Train Step visualizer; ``widget`` shows them.

    ``runner`` is anything with ``.run(**kwargs) -> RunResult`` (default: the kernel's
    ``labkit.pool(world_size)``); the run is ``strategy`` on ``world_size`` ranks with a
    small model and small buckets, so a step has several buckets to overlap.
    """

    READY = ("Click <b>Train Step</b>: the ranks train one more real step, and it is replayed "
             "here from its trace.")

    def __init__(self, runner: Any = None, *, world_size: int = 2,
                 strategy: str = "ddp-bucketed", max_steps: int = 40,
                 **run_kwargs: Any):
        from labkit.config.run import ModelConfig

        self.world_size, self.strategy, self.max_steps = world_size, strategy, max_steps
        self._runner = runner
        self.run_kwargs: dict[str, Any] = {
            "model": ModelConfig(width=256, depth=4), "batch_size": 32, "progress": False,
            "timeout_s": 60, **run_kwargs}
        if strategy == "ddp-bucketed":
            self.run_kwargs.setdefault("options", {"bucket_cap_mb": 0.25})
        self.steps = 0
        self.result: Any = None
        self.story: Any = None
        self.button = w.Button(description="Train Step", button_style="primary",
                               icon="play")
        self.replay_button = w.Button(description="Replay", disabled=True)
        self.reset_button = w.Button(description="Reset")
        self.status = w.HTML(self.READY)
        self.stage = w.HTML()
        self.numbers = w.HTML()
        self.figure = FigureView("Loss, gradients and update of each rank appear here after "
                                 "the first <b>Train Step</b>.")
        self.button.on_click(lambda _b: self.train_step())
        self.replay_button.on_click(lambda _b: self.replay())
        self.reset_button.on_click(lambda _b: self.reset())

    @property
    def widget(self) -> w.VBox:
        return w.VBox([w.HBox([self.button, self.replay_button, self.reset_button]),
                       self.status, self.stage, self.numbers, self.figure.widget])

    def train_step(self) -> None:
        """Train one step further (from the start again after ``max_steps``) and replay it.

        Step 0 is trained but never shown: it pays the one-off costs (first allocations,
        the first use of each connection) that would drown the step's own story."""
        self.steps = self.steps % self.max_steps + 1
        self.status.value = f"running step {self.steps} on {self.world_size} ranks ..."
        runner = warm_runner(self._runner, self.world_size)
        result, seconds, error = timed_run(runner, strategy=self.strategy,
                                           world_size=self.world_size, steps=self.steps + 1,
                                           **self.run_kwargs)
        if error is not None:
            self.steps -= 1
            self.status.value = f"<span style='color:#c00'>the run failed: {error}</span>"
            return
        self.result = result
        self.show()  # drawn before the status says so: "step N:" means the replay is there
        self.status.value = (f"step {self.steps}: trained steps 0-{self.steps} from the seed on "
                             f"{self.world_size} warm ranks in {seconds:.2f} s; mean loss "
                             f"{result.losses[-1]:.4f} (step 0 warms up and is not shown)")

    def show(self) -> None:
        from labkit.visuals.dp_step import step_story, step_table_html

        records = [o.extra["train_step"] for o in self.result.outputs]
        self.story = step_story(self.result.timeline, records)
        self.replay()
        self.numbers.value = step_table_html(self.story)
        self.figure.show(plot_train_step(records))

    def replay(self) -> None:
        """Play the step's animation again (a new drawing restarts its clock)."""
        from labkit.visuals.dp_step import train_step_svg

        if self.story is not None:
            self.stage.value = train_step_svg(self.story)
            self.replay_button.disabled = False

    def reset(self) -> None:
        self.steps, self.result, self.story = 0, None, None
        self.stage.value = self.numbers.value = ""
        self.replay_button.disabled = True
        self.figure.clear()
        self.status.value = "reset: " + self.READY


def train_step_widget(runner: Any = None, *, world_size: int = 2,
                      strategy: str = "ddp-bucketed", **run_kwargs: Any) -> w.VBox:
    """Seed 001's Train Step on real ranks: click to train a step and watch it replayed."""
    return TrainStepPanel(runner, world_size=world_size, strategy=strategy,
                          **run_kwargs).widget
