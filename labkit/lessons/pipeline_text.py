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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from labkit.lessons.machine import load_now, why_not
from labkit.strategies.pipeline.metrics import op_times_ms

SAME = 0.05
"""Two measured bubbles closer than this (share of the step) count as the same."""


def _why(ranks: int) -> str:
    return why_not(load_now(), ranks)


def message_ms(timeline: Any) -> float:
    """Mean duration of a send (steady-state steps, all ranks), ms; a recv would count the
    wait for its sender too."""
    from labkit.base.events import Op

    spans = [e.dur_ns for e in timeline.window().events if e.op == Op.SEND]
    return sum(spans) / len(spans) / 1e6 if spans else 0.0


def activations_text(gpipe: Any, one_f: Any) -> str:
    """GPipe against 1F1B at the same p and m: activations each rank held at its peak
    (counted by the executor) and the two bubbles, each beside the plan's number."""
    g, o = gpipe.metrics, one_f.metrics
    p, m = g["stages"], g["microbatches"]
    lines = [f"rank 0 held at most {g['peak_activations'][0]} microbatches' activations under "
             f"GPipe and {o['peak_activations'][0]} under 1F1B (predicted {m} = m and "
             f"{o['peak_activations_predicted'][0]} = p - rank)"]
    held = g["peak_activations"] == g["peak_activations_predicted"] \
        and o["peak_activations"] == o["peak_activations_predicted"]
    lines.append("every rank held exactly what the plans predict" if held else
                 "a rank held a different count than its plan: report this run")
    gb, ob = g["bubble_fraction"], o["bubble_fraction"]
    line = (f"bubbles: GPipe {gb:.2f}, 1F1B {ob:.2f} (both predicted "
            f"{g['bubble_fraction_predicted']:.2f}, share of total)")
    if abs(gb - ob) < SAME:
        lines.append(line + ": the same bubble, as the plans say")
    else:
        lines.append(line + f": they differ by {abs(gb - ob):.2f} although both plans leave "
                     f"p - 1 = {p - 1} idle slots per rank -- at a few ms per action, timing "
                     f"noise moves a bubble that much; " + _why(p))
    return "\n".join(lines)


def sweep_text(runs: Mapping[int, Any]) -> str:
    """The measured bubble per microbatch count (GPipe runs keyed by m), beside the formula;
    whether it shrank as m grew, and why it sits above the curve."""
    ms = sorted(runs)
    got = {m: runs[m].metrics["bubble_fraction"] for m in ms}
    want = {m: runs[m].metrics["bubble_fraction_predicted"] for m in ms}
    p = runs[ms[0]].metrics["stages"]
    lines = ["  ".join(f"m={m}: {got[m]:.2f} (predicted {want[m]:.2f})" for m in ms)]
    first, last = got[ms[0]], got[ms[-1]]
    if last < first - SAME:
        lines.append(f"the bubble shrank from {first:.2f} to {last:.2f} as m grew from "
                     f"{ms[0]} to {ms[-1]}: the rule holds here")
    else:
        lines.append(f"this run contradicts the rule: the bubble did not shrink from m={ms[0]} "
                     f"to m={ms[-1]}; " + _why(p))
    steps = list(zip(ms, ms[1:]))
    stalls = [(a, b) for a, b in steps if got[b] > got[a] + SAME]
    for a, b in stalls:
        lines.append(f"from m={a} to m={b} it grew ({got[a]:.2f} -> {got[b]:.2f}): each "
                     f"microbatch is 1/{b} of the batch, so its actions are short and the "
                     f"fixed cost of every action and message weighs more (the breakdown "
                     f"below splits it)")
    above = sum(got[m] - want[m] for m in ms) / len(ms)
    lines.append(f"on average the dots sit {above:+.2f} from the curve: the formula prices "
                 f"neither messages nor uneven actions")
    return "\n".join(lines)


def interleave_text(one_f: Any, inter: Any) -> str:
    """What interleaving cost (messages per step, counted) and what it bought (the bubble)."""
    o, i = one_f.metrics, inter.metrics
    p, v = i["stages"], i["virtual"]
    ratio = i["p2p_messages_per_step"] / max(o["p2p_messages_per_step"], 1)
    cuts = (v * p - 1) / (p - 1)
    lines = [f"messages per step: 1F1B {o['p2p_messages_per_step']:.0f}, interleaved "
             f"{i['p2p_messages_per_step']:.0f} ({ratio:.1f}x; predicted {cuts:.0f}x: a "
             f"microbatch crosses v*p - 1 = {v * p - 1} cuts instead of p - 1 = {p - 1})"]
    ob, ib = o["bubble_fraction"], i["bubble_fraction"]
    line = (f"bubble: 1F1B {ob:.2f}, interleaved {ib:.2f} (predicted "
            f"{o['bubble_fraction_predicted']:.2f} and {i['bubble_fraction_predicted']:.2f})")
    if ib < ob - SAME:
        lines.append(line + ": interleaving shrank the bubble, as predicted")
    else:
        ms = op_times_ms(inter.timeline.events)
        lines.append(line + f": this run contradicts the prediction -- each chunk's forward "
                     f"took {ms.get('forward', 0.0):.1f} ms, and {cuts:.0f}x the messages "
                     f"at {message_ms(inter.timeline):.1f} ms each ate what the shorter fill "
                     f"and drain saved; interleaving pays when actions are long next to a "
                     f"message. Also: " + _why(p))
    return "\n".join(lines)


def zero_bubble_text(one_f: Any, zb: Any) -> str:
    """Zero bubble against 1F1B: the bubbles, and whether splitting B into I and W gave two
    halves (the assumption behind the plan's number)."""
    o, z = one_f.metrics, zb.metrics
    ob, zbub = o["bubble_fraction"], z["bubble_fraction"]
    ops = op_times_ms(zb.timeline.events)
    b = op_times_ms(one_f.timeline.events).get("backward", 0.0)
    i, w = ops.get("backward_input", 0.0), ops.get("backward_weight", 0.0)
    lines = [f"1F1B's backward took {b:.1f} ms; split, I took {i:.1f} ms and W {w:.1f} ms "
             + ("(about halves)" if abs(i - w) <= 0.25 * max(i, w) else
                f"(not halves: W is {w / max(i, 1e-9):.1f}x I here)")]
    line = (f"bubble: 1F1B {ob:.2f}, zero bubble {zbub:.2f} (predicted "
            f"{o['bubble_fraction_predicted']:.2f} and {z['bubble_fraction_predicted']:.3f})")
    if zbub < ob - SAME:
        lines.append(line + ": the W's filled bubbles, as planned")
    else:
        lines.append(line + ": this run contradicts the plan -- the plan assumes F = I = W, "
                     "and a W slid into a bubble only fills it when it is as long as the "
                     "gap; " + _why(z["stages"]))
    return "\n".join(lines)


def balance_text(runs: Mapping[str, Any], predicted: Mapping[str, float]) -> str:
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
    if after < 0.9 * before:
        lines.append("the slowest stage set the pace: evening it out sped the line up")
    else:
        lines.append("this run contradicts the rule: the slowest stage did not get 10% "
                     "faster -- the stage times are a few ms per microbatch, and rank 0 timed "
                     "the layers while other work shared the cores, so times and costs it "
                     "measured moved as much as the split; " + _why(count.metrics["stages"]))
    return "\n".join(lines)
