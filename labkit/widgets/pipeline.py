"""Pipeline schedule explorer: pick stages, microbatches and a schedule, see the plan, run it.

Changing a control rebuilds the plan (``labkit.schedules.build_plan``) and shows its text
table and planned figure with the predicted bubble; "Run it for real" starts that many gloo
ranks (``labkit.strategies.pipeline.lab.run_pipeline``) and shows planned vs measured side
by side. A choice the schedule does not allow (e.g. interleaved with m not a multiple of p)
shows the ConfigError message instead. The parts are attributes of ``PipelinePanel`` so a
test can set values and call ``run_button.click()``.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets
from IPython.display import display

from labkit.errors import LabError
from labkit.schedules import SCHEDULES


class PipelinePanel:
    """The controls, the plan view and the run view of the explorer."""

    def __init__(self, stages: int = 2, microbatches: int = 4, schedule: str = "1f1b",
                 run_kwargs: dict[str, Any] | None = None):
        self.schedule = widgets.Dropdown(options=list(SCHEDULES),
                                         value=schedule, description="schedule")
        self.stages = widgets.IntSlider(value=stages, min=1, max=4, description="stages p")
        self.microbatches = widgets.IntSlider(value=microbatches, min=1, max=16,
                                              description="microbatches m")
        self.virtual = widgets.IntSlider(value=2, min=2, max=4, description="virtual v")
        self.run_button = widgets.Button(description="Run it for real", button_style="primary")
        self.plan_out = widgets.Output()
        self.run_out = widgets.Output()
        self.plan: Any = None
        self.result: Any = None
        self.run_kwargs = dict(run_kwargs or {})
        for w in (self.schedule, self.stages, self.microbatches, self.virtual):
            w.observe(lambda _change: self.refresh(), names="value")
        self.run_button.on_click(lambda _b: self.run())
        self.refresh()

    @property
    def widget(self) -> widgets.Widget:
        controls = widgets.HBox([widgets.VBox([self.schedule, self.stages]),
                                 widgets.VBox([self.microbatches, self.virtual])])
        return widgets.VBox([controls, self.plan_out, self.run_button, self.run_out])

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
        """Run the current plan on real ranks and show planned vs measured."""
        from labkit.strategies.pipeline.lab import run_pipeline
        from labkit.visuals.pipeline import plot_planned_vs_measured

        self.run_out.clear_output(wait=True)
        with self.run_out:
            if self.plan is None:
                print("pick a valid plan first")
                return
            print(f"running {self.plan.schedule} on {self.plan.stages} ranks ...")
            try:
                kw = {"model": None, **self.run_kwargs}
                if kw["model"] is None:
                    kw.pop("model")
                self.result = run_pipeline(self.schedule.value, self.plan.stages,
                                           self.plan.microbatches,
                                           virtual=self._virtual(), **kw)
            except LabError as err:
                print(f"the run failed: {err}")
                return
            m = self.result.metrics
            print(f"bubble fraction, share of total: predicted "
                  f"{m['bubble_fraction_predicted']:.3f}, measured {m['bubble_fraction']:.3f}")
            display(plot_planned_vs_measured(self.plan, self.result.timeline))


def pipeline_explorer(stages: int = 2, microbatches: int = 4, schedule: str = "1f1b",
                      **run_kwargs: Any) -> widgets.Widget:
    """The explorer widget for a notebook cell."""
    return PipelinePanel(stages, microbatches, schedule, run_kwargs).widget
