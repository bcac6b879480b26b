"""Lesson 03's timed verdicts read again on dedicated cores (issue 32), and the balance verdict.

Each pipeline verdict of ``labkit.lessons.pipeline_text`` judges one quantity of the runs: a
bubble (the least of the repeats), a difference of two bubbles or a ratio of two pipeline
times (the median of the alternated pairs), the slowest stage's time. Where a verdict is not
"holds", these functions compute the *same* quantity from the same runs replayed on dedicated
cores (``labkit.lessons.replayed.again``: each action at its CPU time, each message at the
run's own typical message of its kind) and say it beside what this machine measured. The
balance rule (split by measured cost, the slowest stage gets faster: Narayanan et al. 2021's
PipeDream planner, GPipe's equal-cost partitions) is judged on one run per split.
Torch-free.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from labkit.analysis.claims import Claim, Sample, Verdict, judge
from labkit.lessons.measure import one_run_ratio


def read(run: Any, key: str = "bubble_fraction") -> float:
    """A pipeline reading of the run's timeline (``timeline_bubble``: the bubble, or
    ``pipeline_ms``); on a replayed run, of its replay."""
    from labkit.strategies.pipeline.metrics import timeline_bubble

    return float(timeline_bubble(run.timeline)[key])


def one_again(what: str, run: Any, measured: float, key: str = "bubble_fraction") -> str:
    """``key`` of one run (the repeat a verdict judged), replayed, beside ``measured``."""
    from labkit.lessons.replayed import again

    return again(what, lambda r: read(r, key), [run], measured)


def pairs_again(what: str, a: Sequence[Any], b: Sequence[Any], measured: float, *,
                key: str = "bubble_fraction", ratio: bool = False) -> str:
    """The median over the alternated pairs of a - b (or a / b) of ``key``, replayed."""
    from labkit.lessons.replayed import again

    k = len(a)

    def pairs(*runs: Any) -> float:
        xs, ys = [read(r, key) for r in runs[:k]], [read(r, key) for r in runs[k:]]
        return statistics.median(x / y if ratio else x - y for x, y in zip(xs, ys))

    return again(what, pairs, list(a) + list(b), measured)


def slowest_stage(runs: Mapping[str, Any], label: str) -> float:
    """The slowest stage's forward + backward per microbatch (ms) of one split, as the figure
    draws it (the run's ``stage_time_ms``)."""
    return float(max(runs[label].metrics["stage_time_ms"]))


def balance_verdict(runs: Mapping[str, Any],
                    repeats: Mapping[str, Sequence[Any]] | None = None) -> Verdict:
    """By layer count / by measured cost, the slowest stage's time of the runs the figure
    shows, above 1; the noise is the half-spread of the alternated ``repeats``' pair-by-pair
    ratios (``pipeline.balance_repeats``), or one run's (``one_run_ratio``) without them."""
    ratio = slowest_stage(runs, "by layer count") / slowest_stage(runs, "by measured cost")
    reps = repeats or {}
    pairs = [max(a.metrics["stage_time_ms"]) / max(b.metrics["stage_time_ms"])
             for a, b in zip(reps.get("by layer count", []), reps.get("by measured cost", []))]
    sample = (Sample(ratio, (max(pairs) - min(pairs)) / 2, tuple(pairs)) if len(pairs) > 1
              else one_run_ratio(ratio))
    return judge(sample, Claim.above(1.0, "cutting where the measured costs balance makes the "
                                          "slowest stage faster"),
                 "slowest stage by layer count / by measured cost", fmt=".2f")


def traced_slowest_ms(run: Any) -> float:
    """The slowest rank's forward + backward per microbatch (ms, mean over the steps after the
    first), read from the timeline's spans: ``stage_time_ms`` as a replay can give it."""
    from labkit.base.events import Op

    tl, micro = run.timeline, run.metrics["microbatches"]
    steps = tl.steps()[1:] or tl.steps()
    work = (Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT)
    return max(statistics.fmean(sum(e.dur_ns for e in tl.select(rank=r, step=s) if e.op in work)
                                for s in steps) / micro / 1e6 for r in tl.ranks)


def balance_again(runs: Mapping[str, Any], verdict: Verdict) -> str:
    """The balance ratio on the two runs replayed on dedicated cores."""
    from labkit.lessons.replayed import again

    return again("slowest stage by layer count / by measured cost",
                 lambda a, b: traced_slowest_ms(a) / traced_slowest_ms(b),
                 [runs["by layer count"], runs["by measured cost"]], verdict.sample.value)
