"""Lesson 11's timed verdicts: the race to the target loss and the gradient rate with a
straggler, judged from the runs (``labkit.analysis.claims``), and read again on the runs
replayed on dedicated cores when a verdict is not "holds" (issue 32).

* ``race_verdict``: BSP's time to the target loss over ASP's, with the straggler: the rule
  (Li et al. 2014; Ho et al. 2013) says ASP gets there first, so the ratio is above 1;
* ``rate_verdict``: ASP's gradients per second over BSP's while every worker computes
  (``async_ps_rates.gradient_rate``): above 1, the formula says ((W-1)F+1)/W.

Each side is one run, so each carries at least ``labkit.lessons.measure.SINGLE_RUN_NOISE``
(a ratio of two runs twice that). Neither ratio is replayed on dedicated cores: ASP's server
took the gradients in the order they arrived, and a replay keeps the order of the trace it is
given (``async_ps.ASP_NOT_REPLAYED``). Torch-free.
"""

from __future__ import annotations

from typing import Any

from labkit.analysis.claims import Claim, Verdict, judge
from labkit.lessons.async_ps_rates import gradient_rate
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
