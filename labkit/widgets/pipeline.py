"""Pipeline schedule explorer: pick stages, microbatches and a schedule, see the plan, run it.

Changing a control rebuilds the plan (``labkit.schedules.build_plan``) and shows its text
table and planned figure with the predicted bubble; "Run it for real" runs it on the
kernel's warm pool of ``p`` ranks (``labkit.pool``, through
``labkit.lessons.pipeline.run_pipeline``) and shows planned vs measured side by side.
From then on, with "rerun as the sliders move" ticked, every change reruns it (debounced:
once the controls rest, ``labkit.widgets.live``), so the measured figure follows the sliders
within about a second; changing ``p`` restarts the pool with that many ranks (a few seconds,
once). A choice the schedule does not allow (e.g. interleaved with m not a multiple of p)
shows the ConfigError message instead. The parts are attributes of ``PipelinePanel`` so a
test can set values and call ``run_button.click()``.
"""

from __future__ import annotations

import time
from typing import Any

import ipywidgets as widgets
from IPython.display import display

from labkit.base.errors import LabError
from labkit.schedules import SCHEDULES
from labkit.widgets.live import Debouncer, FigureView, warm_runner


class PipelinePanel:
    """The controls, the plan view and the run view of the explorer."""

    def __init__(self, stages: int = 2, microbatches: int = 4, schedule: str = "1f1b",
                 run_kwargs: dict[str, Any] | None = None, runner: Any = None):
        self.schedule = widgets.Dropdown(options=list(SCHEDULES), value=schedule,
                                         description="schedule",
                                         style={"description_width": "110px"})
        slider = {"continuous_update": False,  # one event when the hand lets go
                  "style": {"description_width": "110px"}}
        self.stages = widgets.IntSlider(value=stages, min=1, max=4, description="stages p",
                                        **slider)
        self.microbatches = widgets.IntSlider(value=microbatches, min=1, max=16,
                                              description="microbatches m", **slider)
        self.virtual = widgets.IntSlider(value=2, min=2, max=4, description="virtual v",
                                         **slider)
        self.run_button = widgets.Button(description="Run it for real", button_style="primary")
        self.live = widgets.Checkbox(value=True, description="rerun as the sliders move",
                                     indent=False)
        self.plan_out = widgets.Output()
        self.status = widgets.HTML()
        self.measured = FigureView()
        self.plan: Any = None
        self.result: Any = None
        self.run_kwargs = dict(run_kwargs or {})
        self._runner = runner
        self.rerun = Debouncer(self.run)
        for w in (self.schedule, self.stages, self.microbatches, self.virtual):
            w.observe(lambda _change: self.changed(), names="value")
        self.run_button.on_click(lambda _b: self.run())
        self.refresh()

    @property
    def widget(self) -> widgets.Widget:
        controls = widgets.HBox([widgets.VBox([self.schedule, self.stages]),
                                 widgets.VBox([self.microbatches, self.virtual])])
        return widgets.VBox([controls, self.plan_out,
                             widgets.HBox([self.run_button, self.live]), self.status,
                             self.measured.widget])

    def changed(self) -> None:
        """A control moved: redraw the plan now; rerun it (debounced) once it has run."""
        self.refresh()
        if self.live.value and self.result is not None and self.plan is not None:
            self.rerun.trigger()

    def _virtual(self) -> int:
        return self.virtual.value if self.schedule.value == "interleaved" else 1

    def refresh(self) -> None:
        """Rebuild the plan and redraw the planned view (no processes)."""
        from labkit.schedules import build_plan, format_plan, planned_bubble_fraction
        from labkit.theory import bubble_fraction
        from labkit.visuals.pipeline import plot_plan

        self.virtual.layout.display = "" if self.schedule.value == "interleaved" else "none"
        self.plan_out.clear_output(wait=True)
        with self.plan_out:
            try:
                self.plan = build_plan(self.schedule.value, self.stages.value,
                                       self.microbatches.value, self._virtual())
            except LabError as err:
                self.plan = None
                print(f"not a valid choice: {err}")
                return
            print(format_plan(self.plan))
            p, m = self.stages.value, self.microbatches.value
            line = f"planned bubble (simulated, F=1, B=2): {planned_bubble_fraction(self.plan):.3f}"
            if self.schedule.value != "zb":
                line += (f";  formula, share of total: "
                         f"{bubble_fraction(p, m, self.schedule.value, self._virtual()):.3f}")
            print(line)
            display(plot_plan(self.plan))

    def run(self) -> None:
        """Run the current plan on warm ranks; show planned vs measured when it is done (the
        previous figure stays up meanwhile)."""
        from labkit.lessons.pipeline import run_pipeline
        from labkit.visuals.pipeline import plot_planned_vs_measured

        plan = self.plan
        if plan is None:
            self.status.value = "pick a valid plan first"
            return
        self.status.value = f"running {plan.schedule} on {plan.stages} warm ranks ..."
        t0 = time.monotonic()
        try:
            kw = {"model": None, **self.run_kwargs}
            if kw["model"] is None:
                kw.pop("model")
            kw.setdefault("progress", False)  # the status line above says it runs
            self.result = run_pipeline(
                plan.schedule, plan.stages, plan.microbatches, virtual=plan.virtual,
                runner=warm_runner(self._runner, plan.stages), **kw)
        except LabError as err:
            self.status.value = f"<span style='color:#c00'>the run failed: {err}</span>"
            return
        m = self.result.metrics
        self.status.value = (
            f"<b>{plan.schedule}, p={plan.stages}, m={plan.microbatches}</b>: bubble fraction "
            f"(share of total) predicted {m['bubble_fraction_predicted']:.3f}, measured "
            f"<b>{m['bubble_fraction']:.3f}</b> &nbsp; (ran in {time.monotonic() - t0:.2f} s)")
        self.measured.show(plot_planned_vs_measured(plan, self.result.timeline))


def pipeline_explorer(stages: int = 2, microbatches: int = 4, schedule: str = "1f1b",
                      runner: Any = None, **run_kwargs: Any) -> widgets.Widget:
    """The explorer widget for a notebook cell (``runner``: default the kernel's pool)."""
    return PipelinePanel(stages, microbatches, schedule, run_kwargs, runner).widget
