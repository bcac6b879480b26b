"""Lesson 01's timed verdicts (issue 32): weak scaling, the bucket sweep, strong scaling
(Amdahl) and the roofline sweep, each judged from the runs (``labkit.analysis.claims``) and,
where a verdict is not "holds", read again on the runs replayed on dedicated cores
(``labkit.lessons.replayed.again``) or told why there is nothing to replay.

The rules: weak scaling grows the step by the exposed all-reduce (Li et al. 2020's DDP; the
alpha-beta wire time of Thakur et al. 2005); small buckets start all-reducing during backward,
so they hide more of it than one bucket that waits for the whole backward, and their step is
shorter; splitting a fixed batch over ranks shortens the step (Amdahl 1967: by at most
1 / ((1 - f) + f / n)). The notebook checks (``tests/notebooks/claims``) recompute each
verdict with these functions from the lesson's own objects. Torch-free.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from labkit.analysis.claims import Claim, Sample, Verdict, judge
from labkit.lessons.machine import judged_load
from labkit.lessons.measure import one_run_ratio

SCALING_FACTOR = 1.5
"""How far (as a factor) the measured weak-scaling step may sit from the alpha-beta one."""
HIDDEN_MORE = 0.05
"""How much more of its all-reduce a small bucket must hide than one big bucket (a share)."""


def scaling_verdict(runs: Mapping[int, Any], predicted: Mapping[int, float], n: int) -> Verdict:
    """The ``n``-rank step (ms: the median of its steps after the first, their half-spread
    the noise) against the alpha-beta prediction, within ``SCALING_FACTOR``. The rule is
    about ranks with a core each, so the verdict is inconclusive, saying why, where the
    ranks did not have one: more ranks than cores, or other programs busy on the machine
    (``judged_load``). Beside two hogs it read holds in one run and contradicted in the next:
    the prediction adds a wire time the all-reduce bench timed on the same busy machine, at
    another moment, and that noise is not in the step's."""
    from labkit.base.devices import cpu_count

    got = runs[n].step_time_s * 1e3
    steps = [t * 1e3 for t in runs[n].timeline.step_times_s()[1:]] or [got]
    cores = cpu_count()
    load = judged_load(runs[n])
    premise = (f"{n} ranks took turns on {cores} cores, and the rule is about ranks with a "
               f"core each" if n > cores else
               f"while it was judged, {load.text()}, so the {n} ranks did not have a core "
               f"each, and the rule is about ranks with a core each" if load.busy else "")
    return judge(Sample.of(steps, "median"),
                 Claim.within_factor(predicted[n] * 1e3, SCALING_FACTOR,
                                     "the step grows by the exposed all-reduce (t_n = t_1 + "
                                     "its wire time)"),
                 f"{n}-rank step (ms; median of its steps)", fmt=".1f", premise=premise)


def step_ms(run: Any) -> float:
    """A run's (or a replayed run's) median step, ms: the quantity ``scaling_verdict`` judges."""
    return float(run.step_time_s) * 1e3


def hidden_share(run: Any) -> float:
    """The share of the all-reduce hidden under compute, read from the timeline's steps after
    the first (what the run's ``overlap_fraction`` metric reads; a replayed run has only
    its timeline to read it from)."""
    return float(run.timeline.window().overlap_fraction())


def bucket_pair(sweep: Mapping[float, Sequence[Any]]) -> tuple[float, float]:
    """The small and the big bucket size the sweep's verdicts compare (MB)."""
    caps = sorted(sweep)
    return (caps[1] if len(caps) > 2 else caps[0]), caps[-1]


def hidden_diff(small: Sequence[Any], big: Sequence[Any]) -> float:
    """Median over the alternated pairs of (small's hidden share - big's)."""
    return statistics.median(hidden_share(a) - hidden_share(b) for a, b in zip(small, big))


def step_ratio(big: Sequence[Any], small: Sequence[Any]) -> float:
    """Median over the alternated pairs of (big's step / small's step)."""
    return statistics.median(b.step_time_s / a.step_time_s for a, b in zip(small, big))


def bucket_verdicts(sweep: Mapping[float, Sequence[Any]]) -> tuple[Verdict, Verdict]:
    """Small buckets hide more than one big bucket (the pairs' difference of hidden shares,
    above ``HIDDEN_MORE``), and so take a shorter step (big / small, above 1)."""
    small, big = bucket_pair(sweep)
    hidden = judge(Sample.of([a.metrics["overlap_fraction"] - b.metrics["overlap_fraction"]
                              for a, b in zip(sweep[small], sweep[big])]),
                   Claim.above(HIDDEN_MORE, f"{small:g} MB buckets start all-reducing during "
                                            f"backward, so they hide more than one {big:g} MB "
                                            f"bucket"),
                   "share hidden, small minus big", fmt=".2f")
    faster = judge(Sample.ratio([r.step_time_s for r in sweep[big]],
                                [r.step_time_s for r in sweep[small]]),
                   Claim.above(1.0, f"hiding the all-reduce makes the {small:g} MB step shorter"),
                   f"{big:g} MB step / {small:g} MB step", fmt=".2f",
                   premise=overlap_premise(sweep[small][0]))
    return hidden, faster


def overlap_premise(run: Any) -> str:
    """Why hiding cannot shorten ``run``'s step here, or "": each rank's all-reduce runs in a
    thread of its own (gloo's, or DDP's reducer) while its backward computes, so ``n`` ranks
    need ``2 n`` cores for the two to overlap in time; ranks that share them take turns, and
    the hidden share is then time one rank's compute waited anyway. Quiet, 2 ranks on 2
    cores measured the shorter step contradicted (docs/benchmarks.md, issue 32); beside two
    hogs it read holds, inconclusive and contradicted in four runs."""
    from labkit.base.devices import cpu_count

    n, cores = run.config.world_size, cpu_count()
    load = judged_load(run)
    others = load.others if load.busy and load.others == load.others else 0.0
    if cores - others >= 2 * n:
        return ""
    busy = f", and {load.text()}" if load.busy else ""
    return (f"an all-reduce thread beside each rank's backward needs {2 * n} cores for {n} "
            f"ranks; this machine has {cores}{busy}")


def replayed_step_ratio(sweep: Mapping[float, Sequence[Any]]) -> float | None:
    """The verdict's big / small step ratio on the runs replayed on dedicated cores; None
    where a run cannot be replayed."""
    from labkit.lessons.replayed import replayed

    small, big = bucket_pair(sweep)
    k = len(sweep[small])
    copies = [replayed(r) for r in list(sweep[small]) + list(sweep[big])]
    if any(c is None for c in copies):
        return None
    return step_ratio(copies[k:], copies[:k])


def bucket_replays(sweep: Mapping[float, Sequence[Any]], verdicts: Sequence[Verdict]) -> list[str]:
    """For each bucket verdict that is not "holds": its quantity on the runs replayed on
    dedicated cores, beside what this machine measured."""
    from labkit.lessons.replayed import again

    small, big = bucket_pair(sweep)
    s, b, k = list(sweep[small]), list(sweep[big]), len(sweep[small])
    hidden, faster = verdicts
    out = []
    if not hidden.holds:
        out.append(again("share hidden, small minus big",
                         lambda *rs: hidden_diff(rs[:k], rs[k:]), s + b, hidden.sample.value))
    if not faster.holds:
        out.append(again(f"{big:g} MB step / {small:g} MB step",
                         lambda *rs: step_ratio(rs[k:], rs[:k]), s + b, faster.sample.value))
    return out


def speedup_verdict(amdahl: Any, n: int = 2) -> Verdict:
    """Strong scaling: the 1-rank step over the ``n``-rank step of the same global batch, as
    the table and figure show it (each the median of its alternated repeats), above 1; the
    noise is the half-spread of the repeats' pair-by-pair ratios (one run each:
    ``one_run_ratio``'s)."""
    ratio = amdahl.step_times[1] / amdahl.step_times[n]
    pairs = [a / b for a, b in zip(amdahl.repeats.get(1, []), amdahl.repeats.get(n, []))]
    sample = (Sample(ratio, (max(pairs) - min(pairs)) / 2, tuple(pairs)) if len(pairs) > 1
              else one_run_ratio(ratio))
    return judge(sample, Claim.above(1.0, f"splitting the batch over {n} ranks shortens the step"),
                 f"speedup t_1 / t_{n}", fmt=".2f")


def speedup_replay(runs: Mapping[int, Any], verdict: Verdict, n: int = 2) -> str:
    """The speedup on the two runs replayed on dedicated cores, beside what this machine
    measured."""
    from labkit.lessons.replayed import again

    return again(f"speedup t_1 / t_{n}", lambda one, many: one.step_time_s / many.step_time_s,
                 [runs[1], runs[n]], verdict.sample.value)
