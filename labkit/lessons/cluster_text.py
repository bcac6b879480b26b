"""Lesson 10's sentences: what each of its runs showed, read from the rows, beside the rule.

The lesson's prose states the rules (a shaped link delivers its rate; TP belongs inside a
node; hierarchical all-reduce and compression pay where the wire is the wall). These
functions say what *this* run measured, in the same words, and where a measurement
contradicts the rule they say why (``labkit.lessons.machine.why_not``), or that a row could
not be measured here. Pure Python over the rows of ``labkit.lessons.cluster`` and
``cluster_comm``.
"""

from __future__ import annotations

from typing import Any

from labkit.analysis.claims import Claim, Sample, Verdict, judge
from labkit.lessons.machine import NOT_DEDICATED, load_now, why_not
from labkit.lessons.measure import SINGLE_RUN_NOISE, one_run_ratio
from labkit.lessons.replayed import again

RATE_TOLERANCE = 0.05
"""How far a link's measured goodput may sit from its shaped rate and still be 'the rate'
(TCP/IP headers cost 0.7 % at MTU 9000; the probe reads 0.7-2.5 % short here, quiet or
beside 40 busy loops)."""


def _ms(v: float) -> str:
    return f"{v * 1e3:.1f} ms"


def link_text(rows: list[dict[str, Any]], loopback: Any | None = None) -> str:
    """How close each link's goodput came to its shaped rate, and what loopback does."""
    measured = [r for r in rows if r.get("rate_error") is not None]
    lines = []
    off = [r for r in measured if abs(r["rate_error"]) > RATE_TOLERANCE]
    if measured and not off:
        worst = max(measured, key=lambda r: abs(r["rate_error"]))
        lines.append(f"every link delivered its shaped rate within {abs(worst['rate_error']):.1%}"
                     f" (worst: {worst['link']})")
    for r in off:
        lines.append(f"{r['link']} delivered {r['measured_bps'] / 1e6:.1f} Mbit/s, "
                     f"{r['rate_error']:+.1%} off its shaped {r['rate_bps'] / 1e6:.1f} Mbit/s "
                     f"(more than {RATE_TOLERANCE:.0%}): " + _why_off(r.get("load")))
    if not measured:
        lines.append("no link measured here: the rows below use each preset's own figures")
    if loopback is not None:
        lines.append(f"loopback inside one node (2 ranks, gloo, fitted): alpha "
                     f"{loopback.alpha_s * 1e6:.0f} us, {loopback.bandwidth_Bps / 1e9:.2f} GB/s "
                     f"-- the wire every prediction below starts from")
    return "\n".join(lines)


def _why_off(load: Any | None) -> str:
    """Why a probe read its link off the shaped rate: the probe's two processes waited for a
    core, or (on a quiet machine) the shaper itself did not hold the rate."""
    load = load if load is not None else load_now(fresh=True)
    if load.busy:
        return (f"the probe's sender and receiver shared {load.cores} cores and {load.text()}; "
                f"a receiver waiting for a core reads late and a sender waiting for one leaves "
                f"the link idle, and that waiting is not the link's; {NOT_DEDICATED}")
    return (f"on a quiet machine ({load.text()}): the shaper did not hold its rate here; "
            f"`labkit doctor` checks the link")


def placement_text(place: dict[str, Any]) -> str:
    """TP's and the pipeline's bytes and slowdowns across the link, against the rule."""
    rows = {(r["strategy"], r["where"].startswith("inside")): r for r in place["rows"]}
    tp_in, tp_out = rows[("tp", True)], rows[("tp", False)]
    pp_in, pp_out = rows[("pipeline", True)], rows[("pipeline", False)]
    lines = []
    if tp_in.get("link_bytes_per_step") and pp_in.get("link_bytes_per_step"):
        lines.append(f"TP sends {tp_in['link_bytes_per_step'] / pp_in['link_bytes_per_step']:.1f}x "
                     f"the pipeline's bytes per step for the same work")
    for r_in in (tp_in, pp_in):
        if r_in.get("contention"):
            lines.append(f"inside one node, {r_in['strategy']}'s communication took "
                         f"{_ms(r_in['exposed_s'])} per step where the wire needs "
                         f"{_ms(r_in['wire_comm_s'])} ({r_in['contention']:.0f}x): its ranks "
                         f"mostly waited for each other to get a core (marked in the figure)")
    if tp_out.get("slowdown") is None or pp_out.get("slowdown") is None:
        lines.append(f"across the link: predicted only, slowdown TP "
                     f"{tp_out['predicted_slowdown']:.1f}x, pipeline "
                     f"{pp_out['predicted_slowdown']:.1f}x ({tp_out.get('note', '')})")
        return "\n".join(lines)
    lines.append(f"the link slowed TP {tp_out['slowdown']:.1f}x (predicted "
                 f"{tp_out['predicted_slowdown']:.1f}x) and the pipeline "
                 f"{pp_out['slowdown']:.1f}x (predicted {pp_out['predicted_slowdown']:.1f}x)")
    charged = (pp_out.get("predicted_step_s") or 0.0) - (pp_in.get("step_s") or 0.0)
    added = pp_out["step_s"] - pp_in["step_s"]
    if charged > 0 and added < charged:
        lines.append(f"the model charges every pipeline slot two messages ({charged * 1e3:.1f} ms "
                     f"a step: labkit.theory assumes no overlap); the run added "
                     f"{max(added, 0.0) * 1e3:.1f} ms -- its messages travelled while other "
                     f"microbatches computed")
    verdict = placement_verdict(tp_out["slowdown"], pp_out["slowdown"])
    for name, slow in (("TP", tp_out["slowdown"]), ("the pipeline", pp_out["slowdown"])):
        if slow < 1 - SINGLE_RUN_NOISE:
            lines.append(f"{name}'s step got {slow:.2f}x as long across a slower wire, which no "
                         f"wire does: this run's timings carry at least {1 - slow:.0%} of noise, "
                         f"and the verdict below counts it")
    lines.append(verdict.sentence() + ("" if verdict.holds else "; " + why_not(load_now(), 2)))
    if not verdict.holds and all(place.get(k) for k in ("inside", "across")):
        runs = [place[where][name] for name in ("tp", "pipeline") for where in ("inside", "across")]
        lines.append(again("TP's slowdown / the pipeline's", _slowdowns, runs, verdict.sample.value))
    return "\n".join(lines)


def _slowdowns(tp_in: Any, tp_out: Any, pp_in: Any, pp_out: Any) -> float:
    """TP's slowdown across the link over the pipeline's, each read as the table reads it
    (``cluster_predict.step_parts``: the fastest step after the first)."""
    from labkit.lessons.cluster_predict import step_parts

    def slow(inside: Any, across: Any) -> float:
        return float(step_parts(across)["step_s"] / step_parts(inside)["step_s"])

    return slow(tp_in, tp_out) / slow(pp_in, pp_out)


def placement_runs(place: dict[str, Any]) -> dict[str, Any]:
    """The placement's runs by name ("tp inside one node", "pipeline across the link"), for
    the replay a missed verdict draws (``labkit.lessons.replayed.draw_if_missed``)."""
    return {f"{name} {where}": r for where, key in (("inside one node", "inside"),
                                                    ("across the link", "across"))
            for name, r in place.get(key, {}).items()}




def placement_verdict(tp_slowdown: float, pp_slowdown: float) -> Verdict:
    """TP's slowdown across the link over the pipeline's, judged with the noise the runs
    themselves reveal: a slowdown below 1 (a slower wire cannot shorten a step) shows the
    machine's timings off by at least 1 - slowdown at that moment, for every run of the
    comparison; never less than ``SINGLE_RUN_NOISE`` per run. The ratio of two slowdowns
    carries both runs' noise."""
    each = max(SINGLE_RUN_NOISE, 1 - tp_slowdown, 1 - pp_slowdown)
    ratio = tp_slowdown / pp_slowdown
    noise = 2 * each
    return judge(Sample(ratio, ratio * noise, (ratio,)),
                 Claim.above(1.0, "keep tensor parallelism inside a node, let the pipeline "
                                  "cross the slow link (TP is hurt more by it)"),
                 "TP's slowdown / the pipeline's", fmt=".2f")


def hierarchical_verdicts(hier: dict[str, Any]) -> list[Verdict]:
    """Per size measured on the link: the flat ring's time over the hierarchical one's, judged
    against the side of 1 the alpha-beta model puts it on (one run each:
    ``SINGLE_RUN_NOISE``)."""
    by = {(r["impl"], r["bytes"]): r for r in hier["rows"]}
    out = []
    for (impl, size), r in by.items():
        flat = by.get(("ring", size))
        if impl != "hierarchical" or flat is None or r["time_s"] is None or flat["time_s"] is None:
            continue
        pred = flat["predicted_s"] / r["predicted_s"]
        says = (f"at {size / 1e6:g} MB the hierarchical all-reduce is "
                f"{'faster' if pred > 1 else 'no faster'} than the flat ring across the link "
                f"(predicted {pred:.2f}x)")
        claim = Claim.above(1.0, says) if pred > 1 else Claim.below(1.0, says)
        out.append(judge(one_run_ratio(flat["time_s"] / r["time_s"]), claim,
                         "flat / hierarchical time", fmt=".2f"))
    return out


def hierarchical_text(hier: dict[str, Any]) -> str:
    """Hierarchical vs flat, per size: the verdict on what was measured, or the prediction
    where nothing could be; a miss says why (``why_not``: 4 ranks here)."""
    by = {(r["impl"], r["bytes"]): r for r in hier["rows"]}
    lines = [f"{size / 1e6:g} MB: predicted "
             f"{by[('ring', size)]['predicted_s'] / r['predicted_s']:.2f}x faster hierarchical "
             f"(not measured here)" for (impl, size), r in by.items()
             if impl == "hierarchical" and ("ring", size) in by and r["time_s"] is None]
    verdicts = hierarchical_verdicts(hier)
    lines += [v.sentence() for v in verdicts]
    if any(not v.holds for v in verdicts):
        lines.append(why_not(load_now(), 4) + "; no dedicated-core replay: the benchmark "
                     "times its all-reduces on its own clock, not as steps of a trace")
    return "\n".join(lines)


def compression_verdicts(comp: dict[str, Any]) -> list[Verdict]:
    """Per method across the link: plain DDP's step over the method's, above 1 (the rule: on
    the slow link the step is the bytes, so sending fewer pays); one run each."""
    return [judge(one_run_ratio(r["speedup_link"]),
                  Claim.above(1.0, f"{r['method']} pays for itself across the slow link"),
                  "plain DDP's step / this method's", fmt=".2f")
            for r in comp["rows"] if r["method"] != "none" and r["speedup_link"] is not None]


def compression_text(comp: dict[str, Any]) -> str:
    """Which methods paid on loopback (a description: the rule expects a wash there), and
    across the link the verdict per method (``compression_verdicts``); a miss says why and
    reads the same ratio on the two runs replayed on dedicated cores."""
    rows = [r for r in comp["rows"] if r["method"] != "none"]
    paid_loop = [r["method"] for r in rows if r["speedup_loopback"] > 1.05]
    lines = [f"on loopback, faster than plain DDP: {', '.join(paid_loop) or 'none of them'}"]
    verdicts = compression_verdicts(comp)
    runs = comp.get("link", {})
    for v, r in zip(verdicts, (r for r in rows if r["speedup_link"] is not None)):
        lines.append(v.sentence())
        if not v.holds and {"none", r["method"]} <= set(runs):
            lines.append("  " + why_not(load_now(), 2))
            lines.append("  " + again(v.what, lambda a, b: a.step_time_s / b.step_time_s,
                                      [runs["none"], runs[r["method"]]], v.sample.value))
    if verdicts:
        best = max(rows, key=lambda r: r["speedup_link"])
        lines.append(f"the largest speedup across the link: {best['method']} "
                     f"{best['speedup_link']:.1f}x, sending {best['wire_bytes'] / 1e3:.0f} KB "
                     f"a step")
    return "\n".join(lines)


def overhead_verdict(overhead: dict[str, Any]) -> Verdict:
    """The FAQ's ordering (more of the step lost across nodes than inside one) judged on the
    ratio of the two exposed-communication shares; each share is one run's, so it carries at
    least ``SINGLE_RUN_NOISE`` (the ratio twice that)."""
    ratio = overhead["across"] / max(overhead["inside"], 1e-9)
    return judge(one_run_ratio(ratio),
                 Claim.above(1.0, "more of the step is lost to communication across nodes than "
                                  "inside one (the FAQ's ordering)"),
                 "exposed share across / inside", fmt=".2f")


def _shares(inside: Any, across: Any) -> float:
    from labkit.lessons.cluster_predict import step_parts

    def share(r: Any) -> float:
        parts = step_parts(r)
        return float(parts["exposed_s"] / parts["step_s"])

    return share(across) / max(share(inside), 1e-9)


def overhead_text(overhead: dict[str, Any]) -> str:
    """The measured shares beside the FAQ's ranges, and the ordering's verdict; where it does
    not hold, the same ratio on the two runs replayed on dedicated cores."""
    inside, across = overhead["inside"], overhead["across"]
    lo_in, hi_in = overhead["faq_inside"]
    lo_out, hi_out = overhead["faq_across"]
    where = "" if overhead["measured"] else " (across: predicted, not measured here)"
    lines = [f"inside one node: {inside:.0%} of the step (FAQ {lo_in:.0%}-{hi_in:.0%}); "
             f"across {overhead['link']}: {across:.0%} (FAQ {lo_out:.0%}-{hi_out:.0%}){where}"]
    if not overhead["measured"]:
        lines.append("the ordering, predicted: " + ("more of the step is lost across nodes"
                                                    if across > inside else "not more across"))
        return "\n".join(lines)
    verdict = overhead_verdict(overhead)
    lines.append(verdict.sentence() + ("" if verdict.holds else "; " + why_not(load_now(), 2)))
    runs = overhead.get("runs", {})
    if not verdict.holds and len(runs) == 2:
        lines.append(again("exposed share across / inside", _shares,
                           [runs["inside"], runs["across"]], verdict.sample.value))
    return "\n".join(lines)
