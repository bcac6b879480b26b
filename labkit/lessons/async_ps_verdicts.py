"""Lesson 11's timed verdicts: the race to the target loss and the gradient rate with a
straggler, judged from the runs (``labkit.analysis.claims``), and read again on the runs
replayed on dedicated cores when a verdict is not "holds" (issue 32).

* ``race_verdict``: BSP's time to the target loss over ASP's, with the straggler: the rule
  (Li et al. 2014; Ho et al. 2013) says ASP gets there first, so the ratio is above 1;
* ``rate_verdict``: ASP's gradients per second over BSP's while every worker computes
  (``async_ps_rates.gradient_rate``): above 1, the formula says ((W-1)F+1)/W.

Each side is one run, so each carries at least ``labkit.lessons.measure.SINGLE_RUN_NOISE``
(a ratio of two runs twice that). ``race_on_trace`` reads the race from a trace (the time
the server had received as many gradients as it had applied when the loss crossed the
target), so that a replayed run, whose loss log keeps the measured clock, gives it too.
Torch-free.
"""

from __future__ import annotations

from typing import Any

from labkit.analysis.claims import Claim, Verdict, judge
from labkit.lessons.async_ps_rates import _arrivals, gradient_rate
from labkit.lessons.measure import one_run_ratio
from labkit.strategies.ps.records import time_to_loss

RACE = "with a straggler, ASP reaches the target loss before BSP"
RATE = "with a straggler, ASP takes gradients faster than BSP"


def race_times(exp: Any) -> tuple[float | None, float | None]:
    """ASP's and BSP's seconds to the target loss with the straggler (None: never)."""
    return tuple(time_to_loss(exp.runs[f"{c}, straggler"].metrics, exp.target)  # type: ignore[return-value]
                 for c in ("asp", "bsp"))


def race_verdict(exp: Any) -> Verdict:
    """BSP's time to the target over ASP's, above 1. A run that never got there counts with
    its whole loss curve's length (a lower bound: "at least"); ASP never getting there is a
    ratio of 0, which contradicts the rule."""
    asp, bsp = race_times(exp)
    end = exp.runs["bsp, straggler"].metrics["loss_vs_time"][-1][0]
    ratio = 0.0 if asp is None else (end if bsp is None else bsp) / max(asp, 1e-9)
    return judge(one_run_ratio(ratio), Claim.above(1.0, RACE),
                 "BSP's time to the target / ASP's", fmt=".2f")


def rate_ratio(asp: Any, bsp: Any) -> float:
    """ASP's gradients per second over BSP's, while every worker computed."""
    return float(gradient_rate(asp)["rate"] / max(gradient_rate(bsp)["rate"], 1e-12))


def rate_verdict(exp: Any) -> Verdict:
    """``rate_ratio`` of the straggler runs, above 1 (the formula's value in the claim)."""
    w, f = exp.settings["world_size"] - 1, exp.settings["factor"]
    ratio = rate_ratio(exp.runs["asp, straggler"], exp.runs["bsp, straggler"])
    return judge(one_run_ratio(ratio),
                 Claim.above(1.0, f"{RATE} (the formula: ((W-1)F+1)/W = "
                                  f"{((w - 1) * f + 1) / w:.2f}x)"),
                 "ASP / BSP gradients per second", fmt=".2f")


def _gradients_at_target(metrics: dict[str, Any], target: float) -> int | None:
    """How many gradients the server had received when the loss crossed ``target``."""
    t = time_to_loss(metrics, target)
    if t is None:
        return None
    per = metrics["workers"] if metrics["consistency"] == "bsp" else 1
    done = sum(1 for when, _ in metrics["loss_vs_time"] if when <= t)
    return done * per


def race_on_trace(asp: Any, bsp: Any, target: float) -> float:
    """BSP's time to the target over ASP's, read from the traces: seconds from the first pull
    until server 0 had received the gradients it had applied when the loss crossed
    ``target``. Raises ValueError where a run never got there."""
    def seconds(run: Any) -> float:
        n = _gradients_at_target(run.metrics, target)
        arrived = sorted(t for ts in _arrivals(run).values() for t in ts)
        if n is None or not arrived:
            raise ValueError(f"the {run.metrics['consistency']} run never reached {target:g}")
        pulls = [e.start_ns for e in run.timeline.events if e.name == "pull"]
        return (arrived[min(n, len(arrived)) - 1] - min(pulls, default=arrived[0])) / 1e9

    return seconds(bsp) / max(seconds(asp), 1e-9)
