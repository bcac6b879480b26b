"""Lesson 03's sentences: what this run showed about bubbles, held activations, interleaving,
zero bubble and balance, beside what the plans predict.

The prose of lesson 03 states the rules of GPipe (Huang et al. 2019), 1F1B (PipeDream-Flush,
Narayanan et al. 2021), interleaved 1F1B (same paper) and Zero Bubble (Qi et al. 2023). The
formulas assume every action costs the same and messages are free; the lesson's actions
last a few milliseconds on a laptop, so fixed costs (Python per action, about half a
millisecond per message) and a busy core can move a measured bubble by as much as the rule
does. These functions read the runs and say, with the numbers, whether the rule showed here,
and when it did not, which of those reasons applies. Torch-free: reads ``RunResult`` metrics
and timelines.

Each function takes a run or a list of repeats of it (``labkit.lessons.pipeline.
repeat_pipeline``: variants alternated); every timed sentence is a verdict computed from the
repeats (``labkit.analysis.claims``): holds, contradicted, or inconclusive on this machine
with the noise it measured. A single run can never "hold".
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from labkit.analysis.claims import Claim, Sample, Verdict, judge
from labkit.lessons.machine import load_now, why_not
from labkit.lessons.pipeline_replays import (
    balance_again,
    balance_verdict,
    one_again,
    pairs_again,
)
from labkit.strategies.pipeline.metrics import op_times_ms

SAME = 0.05
"""Two measured bubbles closer than this (share of the step) count as the same; a bubble
this close to the formula agrees with it (the self-test's margin, ``BUBBLE_TOL``)."""


def _runs(x: Any) -> list[Any]:
    """A run or its repeats, as a list."""
    return list(x) if isinstance(x, Sequence) else [x]


def least(x: Any, key: str = "bubble_fraction") -> Any:
    """The repeat whose ``key`` metric is least: the run a lesson's table and figure show,
    so they read the same number as the sentence (the least of the repeats)."""
    return min(_runs(x), key=lambda r: r.metrics[key])


def bubbles(x: Any) -> list[float]:
    return [r.metrics["bubble_fraction"] for r in _runs(x)]


def _pairs(a: Any, b: Any, key: str = "bubble_fraction") -> Sample:
    """a - b run by run (repeats alternated: each pair shared its moment's load)."""
    return Sample.of([x.metrics[key] - y.metrics[key] for x, y in zip(_runs(a), _runs(b))])


def _tail(v: Verdict, ranks: int) -> str:
    """What a lesson adds after a verdict that is not "holds": the cores, the load."""
    return "" if v.holds else "; " + _why(ranks)


def _why(ranks: int) -> str:
    return why_not(load_now(), ranks)


def message_ms(timeline: Any) -> float:
    """Mean duration of a send (steady-state steps, all ranks), ms; a recv would count the
    wait for its sender too."""
    from labkit.base.events import Op

    spans = [e.dur_ns for e in timeline.window().events if e.op == Op.SEND]
    return sum(spans) / len(spans) / 1e6 if spans else 0.0


def same_bubble_verdict(gpipe: Any, one_f: Any) -> Verdict:
    """GPipe's bubble minus 1F1B's over the alternated pairs, within ``SAME`` of 0."""
    p = _runs(gpipe)[0].metrics["stages"]
    return judge(_pairs(gpipe, one_f),
                 Claim.near(0.0, SAME, f"both plans leave p - 1 = {p - 1} idle slots per rank, "
                                       f"so GPipe's and 1F1B's bubbles are the same"),
                 "GPipe's bubble minus 1F1B's", fmt=".2f")


def activations_text(gpipe: Any, one_f: Any) -> str:
    """GPipe against 1F1B at the same p and m: activations each rank held at its peak
    (counted by the executor) and the two bubbles, each beside the plan's number."""
    g, o = _runs(gpipe)[0].metrics, _runs(one_f)[0].metrics
    p, m = g["stages"], g["microbatches"]
    lines = [f"rank 0 held at most {g['peak_activations'][0]} microbatches' activations under "
             f"GPipe and {o['peak_activations'][0]} under 1F1B (predicted {m} = m and "
             f"{o['peak_activations_predicted'][0]} = p - rank)"]
    held = all(r.metrics["peak_activations"] == r.metrics["peak_activations_predicted"]
               for r in _runs(gpipe) + _runs(one_f))
    lines.append("every rank held exactly what the plans predict" if held else
                 "a rank held a different count than its plan: report this run")
    v = same_bubble_verdict(gpipe, one_f)
    lines.append(f"bubbles: GPipe {min(bubbles(gpipe)):.2f}, 1F1B {min(bubbles(one_f)):.2f} "
                 f"(least of {len(_runs(gpipe))}; both predicted "
                 f"{g['bubble_fraction_predicted']:.2f}, share of total)")
    lines.append(v.sentence() + _tail(v, p))
    if not v.holds:
        lines.append("  " + pairs_again("GPipe's bubble minus 1F1B's", _runs(gpipe), _runs(one_f),
                                        v.sample.value))
    return "\n".join(lines)


def replayed(run: Any, plan: Any = None, *, dedicated: bool = True) -> float:
    """The run's plan (``plan``, else the schedule it ran) re-timed with what its actions
    really cost, messages free: this algorithm with these actions on a core of its own
    (each action's CPU time; ``dedicated=False``: its wall time, waits for a core included)
    and a free wire (``labkit.strategies.pipeline.metrics.replayed_bubble``)."""
    from labkit.schedules import build_plan
    from labkit.strategies.pipeline.metrics import replayed_bubble

    m = run.metrics
    if plan is None:
        plan = build_plan(m["schedule"], m["stages"], m["microbatches"], m["virtual"])
    return replayed_bubble(run.timeline, plan, dedicated=dedicated)


def stage_costs(runs: Any) -> list[float] | None:
    """Each stage's forward + backward a microbatch (ms), the mean of the repeats'
    ``stage_time_ms``: the costs whose slowest stage paces a GPipe or 1F1B plan. None where
    a run lacks them, one is not positive, or the plan has more than one chunk per rank."""
    reps = _runs(runs)
    first = reps[0].metrics
    rows = [r.metrics.get("stage_time_ms") or [] for r in reps]
    if first.get("virtual", 1) != 1 or any(
            len(row) != first["stages"] or min(row) <= 0 for row in rows):
        return None
    return [statistics.fmean(col) for col in zip(*rows)]


def sweep_stage_costs(runs: Mapping[int, Any]) -> dict[int, list[float]]:
    """``stage_costs`` of each m of a sweep (where the runs have them): what
    ``formula_verdict`` judges each m against and ``plot_bubble_sweep(..., stage_costs=)``
    marks."""
    return {m: c for m in sorted(runs) if (c := stage_costs(runs[m])) is not None}


def stages_bubble(runs: Any) -> float | None:
    """The bubble the repeats' own stages give their plan (``stage_costs``, the slowest
    setting the pace: ``theory.uneven_bubble_fraction``); None without stage costs."""
    from labkit.theory import uneven_bubble_fraction

    costs = stage_costs(runs)
    return None if costs is None else uneven_bubble_fraction(
        costs, _runs(runs)[0].metrics["microbatches"])


def formula_verdict(runs: Any, what: str) -> Verdict:
    """The least measured bubble of the repeats against the plan's bubble +- ``SAME``: with
    the repeats' own stage costs (``stage_costs``), ``1 - m*sum(c) / (p*(sum(c) + (m-1)*
    max(c)))``, the slowest stage setting the pace (``theory.uneven_bubble_fraction``);
    without them, equal stages' ``(p-1)/(m+p-1)``.

    The formula assumes equal stages. On lesson 03's MLP the last stage also computes the
    classifier and the loss, and a stage's time moves from run to run (stage 1 / stage 0 read
    0.88-1.58 in ten quiet sweeps); against equal stages the m = 8 bubble held in 2 of those
    10 sweeps, against each m's own stages in 10 of 10 (m = 4: 9 and 10 of 10; residuals
    -0.024 to +0.027, docs/benchmarks.md)."""
    equal = _runs(runs)[0].metrics["bubble_fraction_predicted"]
    yours = stages_bubble(runs)
    claim = (Claim.near(equal, SAME, "the bubble is the plan's (p-1)/(m+p-1)") if yours is None
             else Claim.near(yours, SAME, f"the slowest of your stages paces the plan (equal "
                                          f"stages: (p-1)/(m+p-1) = {equal:.2f})"))
    return judge(Sample.of(bubbles(runs), "min"), claim, what, fmt=".2f")


def shrink_verdict(runs: Mapping[int, Any]) -> Verdict:
    """The fewest microbatches' bubble minus the most's, over the pairs, above ``SAME``."""
    ms = sorted(runs)
    return judge(_pairs(runs[ms[0]], runs[ms[-1]]),
                 Claim.above(SAME, f"going from m={ms[0]} to m={ms[-1]} microbatches shrinks "
                                   f"the bubble"), f"m={ms[0]} minus m={ms[-1]}", fmt=".2f")


def sweep_verdicts(runs: Mapping[int, Any]) -> list[Verdict]:
    """Every verdict ``sweep_text`` prints: each m against the formula, then the shrink."""
    return [formula_verdict(runs[m], f"the bubble at m={m}") for m in sorted(runs)] + [
        shrink_verdict(runs)]


def stages_text(runs: Mapping[int, Any]) -> str:
    """The sweep's stages as measured and the bubble they predict at each m.

    The formula assumes equal stages. Each stage's forward + backward a microbatch (the mean
    of each m's repeats, ``stage_costs``) gives the bubble unequal stages leave: the slowest
    stage paces the pipeline, so a step takes ``sum(c) + (m-1) max(c)``
    (``labkit.theory.uneven_bubble_fraction``; only the stages' ratios matter), and equal
    stages give the formula back. ``formula_verdict`` judges each m against it, and
    ``plot_bubble_sweep(..., stage_costs=sweep_stage_costs(runs))`` marks it. Empty where a
    run lacks its stages' times."""
    costs = sweep_stage_costs(runs)
    ms = sorted(runs)
    if sorted(costs) != ms:
        return ""
    p = len(costs[ms[0]])

    def one(m: int) -> str:
        c = costs[m]
        slow, fast = c.index(max(c)), c.index(min(c))
        than = f"stage {slow} {c[slow] / c[fast]:.2f}x stage {fast}" if slow != fast else "equal"
        return f"m={m} " + " and ".join(f"{t:.1f}" for t in c) + f" ms ({than})"

    last = all(max(c) == c[-1] > min(c) for c in costs.values())
    why = "; the last stage also computes the classifier and the loss" if last else ""
    reps = len(_runs(runs[ms[0]]))
    uneven = ", ".join(f"m={m} {stages_bubble(runs[m]):.2f}" for m in ms)
    equal = ", ".join(f"{_runs(runs[m])[0].metrics['bubble_fraction_predicted']:.2f}"
                      for m in ms)
    return (f"your {p} stages' forward + backward a microbatch (the mean of each m's {reps} "
            f"runs): " + ", ".join(one(m) for m in ms) + f"{why}. The slowest stage paces "
            f"the pipeline: a step takes sum(c) + (m-1)*max(c), so the bubble is 1 - "
            f"m*sum(c) / (p*(sum(c) + (m-1)*max(c))): {uneven} (the diamonds; equal stages, "
            f"the formula: {equal}). Each bubble below is judged against its own stages.")


def sweep_text(runs: Mapping[int, Any]) -> str:
    """The measured bubble per microbatch count (GPipe runs, or their repeats, keyed by m)
    beside the formula, each judged, and beside what the run's own unequal stages predict
    (``stages_text``); whether it shrank as m grew; and, where a bubble misses
    the formula, the same plan replayed with the run's own action times (CPU time: each rank on a
    core of its own) and free messages."""
    ms = sorted(runs)
    p = _runs(runs[ms[0]])[0].metrics["stages"]
    want = {m: _runs(runs[m])[0].metrics["bubble_fraction_predicted"] for m in ms}
    got = {m: min(bubbles(runs[m])) for m in ms}
    yours = {m: "" if (b := stages_bubble(runs[m])) is None else f", your stages {b:.2f}"
             for m in ms}
    lines = ["  ".join(f"m={m}: {got[m]:.2f} (formula {want[m]:.2f}{yours[m]})" for m in ms)
             + f"  (least of {len(_runs(runs[ms[0]]))} runs each)"]
    if stages := stages_text(runs):
        lines.append(stages)
    missed = []
    for m in ms:
        v = formula_verdict(runs[m], f"the bubble at m={m}")
        lines.append(v.sentence())
        if not v.holds:
            missed.append(m)
    shrink = shrink_verdict(runs)
    lines.append(shrink.sentence() + _tail(shrink, p))
    if not shrink.holds:
        lines.append("  " + pairs_again(f"m={ms[0]} minus m={ms[-1]}", _runs(runs[ms[0]]),
                                        _runs(runs[ms[-1]]), shrink.sample.value))
    for m in missed:
        lines.append("  " + one_again(f"the bubble at m={m}", least(runs[m]), got[m]))
        replay = replayed(least(runs[m]))  # the repeat whose bubble the line above judged
        lines.append(f"m={m} replayed with this run's own action times (the CPU time each "
                     f"took: a core per rank) and free messages: {replay:.2f} (formula "
                     f"{want[m]:.2f}): {replay - want[m]:+.2f} is uneven actions, "
                     f"{got[m] - replay:+.2f} is what messages and waiting for a core added")
    return "\n".join(lines)


def interleave_verdict(one_f: Any, inter: Any) -> Verdict:
    """1F1B's bubble minus interleaved's, over the pairs, above 0."""
    return judge(_pairs(one_f, inter), Claim.above(0.0, "interleaving shrinks the bubble"),
                 "1F1B's bubble minus interleaved's", fmt=".2f")


def interleave_text(one_f: Any, inter: Any) -> str:
    """What interleaving cost (messages per step, counted) and what it bought (the bubble,
    judged over the repeats)."""
    o, i = _runs(one_f)[0].metrics, _runs(inter)[0].metrics
    p, v = i["stages"], i["virtual"]
    ratio = i["p2p_messages_per_step"] / max(o["p2p_messages_per_step"], 1)
    cuts = (v * p - 1) / (p - 1)
    lines = [f"messages per step: 1F1B {o['p2p_messages_per_step']:.0f}, interleaved "
             f"{i['p2p_messages_per_step']:.0f} ({ratio:.1f}x; predicted {cuts:.0f}x: a "
             f"microbatch crosses v*p - 1 = {v * p - 1} cuts instead of p - 1 = {p - 1})"]
    lines.append(f"bubble: 1F1B {min(bubbles(one_f)):.2f}, interleaved "
                 f"{min(bubbles(inter)):.2f} (predicted {o['bubble_fraction_predicted']:.2f} "
                 f"and {i['bubble_fraction_predicted']:.2f})")
    verdict = interleave_verdict(one_f, inter)
    lines.append(verdict.sentence())
    if not verdict.holds:
        first = least(inter)
        ms = op_times_ms(first.timeline.events)
        lines.append(f"each chunk's forward took {ms.get('forward', 0.0):.1f} ms, and {cuts:.0f}x "
                     f"the messages at {message_ms(first.timeline):.1f} ms each ate what the "
                     f"shorter fill and drain saved: interleaving pays when actions are long "
                     f"next to a message (replayed with free messages: "
                     f"{replayed(first):.2f}); " + _why(p))
        lines.append("  " + pairs_again("1F1B's bubble minus interleaved's", _runs(one_f),
                                        _runs(inter), verdict.sample.value))
    return "\n".join(lines)


def zero_bubble_verdict(one_f: Any, zb: Any) -> Verdict:
    """1F1B's pipeline time / zero bubble's, over the pairs, above 1."""
    return judge(Sample.ratio([r.metrics["pipeline_ms"] for r in _runs(one_f)],
                              [r.metrics["pipeline_ms"] for r in _runs(zb)]),
                 Claim.above(1.0, "W's slid into the bubbles shorten the pipeline"),
                 "1F1B's pipeline time / zero bubble's", fmt=".2f")


def zero_bubble_text(one_f: Any, zb: Any) -> str:
    """Zero bubble against 1F1B: whether splitting B into I and W gave two halves (the
    assumption behind the plan's number), and whether the pipeline got shorter, judged over
    the repeats (pipeline window: first action to last, per step)."""
    fast_o, fast_z = least(one_f, "pipeline_ms"), least(zb, "pipeline_ms")
    o, z = fast_o.metrics, fast_z.metrics
    ops, ops_o = op_times_ms(fast_z.timeline.events), op_times_ms(fast_o.timeline.events)
    b = ops_o.get("backward", 0.0)
    i, w = ops.get("backward_input", 0.0), ops.get("backward_weight", 0.0)
    lines = [f"1F1B's backward took {b:.1f} ms; split, I took {i:.1f} ms and W {w:.1f} ms "
             + ("(about halves)" if abs(i - w) <= 0.25 * max(i, w) else
                f"(not halves: W is {w / max(i, 1e-9):.1f}x I here)")]
    # the runs the table and figure show (each schedule's shortest pipeline), not each
    # schedule's least bubble: a sentence and the table beside it read the same runs
    lines.append(f"bubble of those runs (the shortest pipeline of each): 1F1B "
                 f"{o['bubble_fraction']:.2f}, zero bubble {z['bubble_fraction']:.2f} "
                 f"(predicted {o['bubble_fraction_predicted']:.2f} and "
                 f"{z['bubble_fraction_predicted']:.3f})")
    lines.append(_work_and_bubble(ops_o.get("forward", 0.0) + b,
                                  ops.get("forward", 0.0) + i + w, o, z))
    verdict = zero_bubble_verdict(one_f, zb)
    lines.append(verdict.sentence())
    if not verdict.holds:
        lines.append("the plan assumes F = I = W, and a W slid into a bubble only fills it "
                     "when it is as long as the gap; " + _why(z["stages"]))
        lines.append("  " + pairs_again("1F1B's pipeline time / zero bubble's", _runs(one_f),
                                        _runs(zb), verdict.sample.value, key="pipeline_ms",
                                        ratio=True))
    return "\n".join(lines)


def _work_and_bubble(work_o: float, work_z: float, o: Mapping[str, Any],
                     z: Mapping[str, Any]) -> str:
    """Zero bubble's pipeline over 1F1B's, split in its two factors: a rank is busy
    ``1 - bubble`` of the pipeline, doing m microbatches' work, so the pipeline lasts
    m x work / (1 - bubble); the ratio is the work ratio times the busy-share ratio."""
    if not work_o or not o.get("pipeline_ms"):
        return "no actions to compare the two schedules' work per microbatch"
    wr = work_z / work_o
    br = (1 - o["bubble_fraction"]) / max(1 - z["bubble_fraction"], 1e-9)
    line = (f"zero bubble's pipeline / 1F1B's = its work per microbatch (F + I + W "
            f"{work_z:.1f} ms / F + B {work_o:.1f} ms = {wr:.2f}) x the busy shares ((1 - "
            f"{o['bubble_fraction']:.2f}) / (1 - {z['bubble_fraction']:.2f}) = {br:.2f}) = "
            f"{wr * br:.2f}; measured {z['pipeline_ms'] / o['pipeline_ms']:.2f}")
    if wr > 1.02 and wr * br >= 0.97:
        line += (": splitting B cost about as much extra compute as the smaller bubble saved "
                 "(the plan counts I + W as one B)")
    return line


def balance_text(runs: Mapping[str, Any], predicted: Mapping[str, float],
                 repeats: Mapping[str, Sequence[Any]] | None = None) -> str:
    """Split by layer count against split by measured cost: where the cut moved, the slowest
    stage (per microbatch) and the step, measured, beside the predicted gain."""
    count, cost = runs["by layer count"], runs["by measured cost"]
    slow = {k: max(r.metrics["stage_time_ms"]) for k, r in runs.items()}
    before, after = slow["by layer count"], slow["by measured cost"]
    layers = [b - a for a, b in zip(cost.metrics["stage_bounds"],
                                    cost.metrics["stage_bounds"][1:])]
    gain = count.step_time_s / max(cost.step_time_s, 1e-12)
    pred = predicted["by measured cost"] / predicted["by layer count"]
    lines = [f"by measured cost the stages got {layers} layers; the slowest stage went from "
             f"{before:.1f} to {after:.1f} ms per microbatch ({before / max(after, 1e-9):.2f}x)",
             f"step {count.step_time_s * 1e3:.0f} -> {cost.step_time_s * 1e3:.0f} ms: "
             f"{gain:.2f}x measured, {pred:.2f}x predicted from the stage times"]
    verdict = balance_verdict(runs, repeats)
    lines.append(verdict.sentence())
    if verdict.holds:
        lines.append("the slowest stage set the pace: evening it out sped the line up")
    else:
        lines.append("  " + balance_again(runs, verdict))
        lines.append("the two splits ran one after the other, each beside whatever else the "
                     "machine ran at that moment, and rank 0 timed the layers beside it too, so a "
                     "stage's time moved with the load as much as with the split; "
                     + _why(count.metrics["stages"]))
    return "\n".join(lines)
