"""Lesson 11's experiment: BSP, ASP and SSP, without and with a straggler, on real ranks.

Six ``labkit run ps`` runs on the same data and the same number of samples (every worker
takes ``steps`` steps): each consistency model, first with equal workers, then with the
last worker computing ``factor`` times slower. For each run the table gives

* how fast updates flowed (``updates_per_s``) and how stale they were;
* the **time to reach the target loss** (``records.time_to_loss``: the loss averaged over
  the last dozen gradients, so every model is smoothed over the same samples);
* the **price of staleness**: the loss at the end (mean of the last eighth of the steps,
  the same samples for every run) and how far the final weights are from synchronous SGD
  on the same data (``max_abs_diff_vs_reference``: 0 up to rounding for BSP).

Each worker's batch is large enough that computing a gradient costs more than a message:
that is when a parameter server is worth having, and when a straggler hurts.
Torch-free: it only starts runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from labkit.config.run import ModelConfig, RunConfig
from labkit.strategies.ps.records import time_to_loss

LESSON_MODEL = ModelConfig(width=128, depth=2)
LESSON_RUN: dict[str, Any] = {"strategy": "ps", "world_size": 3, "steps": 30, "lr": 0.4,
                              "batch_size": 1024, "model": LESSON_MODEL, "backend": "gloo",
                              "progress": False, "check_reference": True, "timeout_s": 180}
"""1 server + 2 workers (three processes: on two cores nobody waits for a core while the
straggler idles), 30 steps of 1024 samples per worker, SGD at 0.4."""
TARGET_LOSS = 1.8
"""The loss the lesson races to (from about 2.3 at the start)."""


@dataclass
class PSExperiment:
    runs: dict[str, Any]
    """Name ("asp, straggler") -> the RunResult."""
    target: float
    settings: dict[str, Any] = field(default_factory=dict)

    def row(self, name: str) -> dict[str, Any]:
        res = self.runs[name]
        m = res.metrics
        tail = res.losses[-max(1, len(res.losses) // 8):]
        return {"run": name, "updates": m["updates"], "updates_per_s": m["updates_per_s"],
                "mean_staleness": m["mean_staleness"], "max_staleness": m["max_staleness"],
                "time_to_target_s": time_to_loss(m, self.target),
                "final_loss": sum(tail) / len(tail),
                "diff_vs_sync": m.get("max_abs_diff_vs_reference", math.nan)}

    def table(self) -> list[dict[str, Any]]:
        return [self.row(name) for name in self.runs]

    def text(self) -> str:
        """The table as aligned text (print it in a notebook)."""
        head = (f"{'run':<18}{'updates':>8}{'upd/s':>8}{'stale':>7}{'max':>5}"
                f"{'t to ' + format(self.target, 'g') + ' (s)':>14}{'final loss':>12}"
                f"{'|w - w_sync|':>14}")
        lines = [head]
        for r in self.table():
            t = "never" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.2f}"
            lines.append(f"{r['run']:<18}{r['updates']:>8}{r['updates_per_s']:>8.0f}"
                         f"{r['mean_staleness']:>7.2f}{r['max_staleness']:>5}{t:>14}"
                         f"{r['final_loss']:>12.4f}{r['diff_vs_sync']:>14.2g}")
        return "\n".join(lines)


def consistency_experiment(*, factor: float = 4.0, bound: int = 2, target: float = TARGET_LOSS,
                           consistencies: tuple[str, ...] = ("bsp", "asp", "ssp"),
                           **overrides: Any) -> PSExperiment:
    """Run every consistency model without and with a straggler (the last worker)."""
    from labkit.api import run

    common = {**LESSON_RUN, **overrides}
    last = common["world_size"] - 1
    runs: dict[str, Any] = {}
    for straggler in ("", f"{last}:{factor:g}"):
        for consistency in consistencies:
            options: dict[str, Any] = {"servers": 1, "consistency": consistency,
                                       "straggler": straggler}
            if consistency == "ssp":
                options["staleness"] = bound
            name = f"{consistency}{', straggler' if straggler else ''}"
            runs[name] = run(RunConfig(**common, options=options))
    return PSExperiment(runs, target, {"factor": factor, "bound": bound,
                                       "straggler_rank": last, **common})


def straggler_predictions(exp: PSExperiment) -> list[dict[str, Any]]:
    """The two formulas of the lesson next to the runs with the straggler.

    With W workers, one F times slower than the others and compute the only cost:

    * BSP moves at the straggler's pace: W gradients per slow step t_slow. ASP takes every
      gradient as it comes: (W - 1) fast workers at F / t_slow each plus the slow one, so
      ASP / BSP gradients per second = ((W - 1) F + 1) / W;
    * while the straggler computes one gradient, the W - 1 fast workers push F each: its
      gradients arrive up to (W - 1) F updates late under ASP (SSP cuts that at K). Only
      while the fast workers still run: they finish their steps first, and the straggler's
      last gradients are fresh, so the *maximum* is the number to compare.

    Messages cost time too, which the formulas leave out; the gap is that cost.
    """
    w = exp.settings["world_size"] - 1
    f = exp.settings["factor"]
    bsp, asp = exp.runs["bsp, straggler"].metrics, exp.runs["asp, straggler"].metrics
    return [{"quantity": "ASP / BSP gradients per second", "predicted": ((w - 1) * f + 1) / w,
             "measured": asp["updates_per_s"] / (bsp["updates_per_s"] * w)},
            {"quantity": "ASP's largest staleness (updates)", "predicted": (w - 1) * f,
             "measured": asp["max_staleness"]}]
