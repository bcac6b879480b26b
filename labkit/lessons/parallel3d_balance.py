"""Lesson 09's balance claim as a verdict (issue 32): cutting the GPT's pipeline where the
measured costs balance makes the slowest stage faster (the heavy word-piece head sits on the
last stage; Narayanan et al. 2021 balance stages by profiled cost), judged on one run per
split and, where the verdict is not "holds", read again on the two runs replayed on dedicated
cores (``labkit.lessons.replayed.again``). Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from labkit.analysis.claims import Claim, Verdict, judge
from labkit.lessons.machine import judged_load
from labkit.lessons.measure import SINGLE_RUN_NOISE, one_run_ratio

WHAT = "slowest stage by block count / by measured cost"


def stage_ms(result: Any) -> list[float]:
    """Each stage's forward + backward time per microbatch, in its least disturbed step:
    for every rank (one stage each), the compute of each step after the first divided by
    the microbatches, and the smallest of those. On a shared laptop a step now and then
    waits for a core; the fastest one is the stage's own cost."""
    from labkit.base.events import Op

    tl = result.timeline
    micro = result.config.options.microbatches
    steps = tl.steps()[1:] or tl.steps()
    out = []
    for rank in tl.ranks:
        per_step = [sum(e.dur_ns for e in tl.select(rank=rank, step=s)
                        if e.op in (Op.FORWARD, Op.BACKWARD)) / micro / 1e6 for s in steps]
        out.append(min(per_step) if per_step else 0.0)
    return out


def slowest_ms(run: Any) -> float:
    """The slowest stage's forward + backward per microbatch, in its least disturbed step
    (``stage_ms``; of a replayed run, its replay's)."""
    return max(stage_ms(run))


def balance_verdict(runs: Mapping[str, Any]) -> Verdict:
    """By block count / by measured cost, the slowest stage's time, above 1 (one run each:
    ``one_run_ratio``'s noise, which is a quiet machine's). Where other programs were busy
    when it was first judged (``machine.judged_load``) it is inconclusive, saying why: beside
    two hogs it read 1.43 (holds) in one run and 0.88 (contradicted) in the next."""
    ratio = slowest_ms(runs["by block count"]) / slowest_ms(runs["by measured cost"])
    load = judged_load(runs["by block count"])
    premise = (f"one run each, and {load.text()}: one run cannot measure its own noise, and a "
               f"busy machine's is larger than the {SINGLE_RUN_NOISE:.0%} a quiet one's "
               f"is given" if load.busy else "")
    return judge(one_run_ratio(ratio),
                 Claim.above(1.0, "cutting where the measured costs balance makes the slowest "
                                  "stage faster"), WHAT, fmt=".2f", premise=premise)


def balance_again(runs: Mapping[str, Any], verdict: Verdict) -> str:
    """The same ratio on the two runs replayed on dedicated cores, beside the measured one."""
    from labkit.lessons.replayed import again

    return again(WHAT, lambda a, b: slowest_ms(a) / slowest_ms(b),
                 [runs["by block count"], runs["by measured cost"]], verdict.sample.value)
