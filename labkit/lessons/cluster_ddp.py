"""Lesson 10's DDP rows as verdicts (issue 32): weak scaling and the step predicted across
each link, judged from the runs' own steps, and read again on the runs replayed on dedicated
cores when a verdict is not "holds".

The rules: with the same batch per rank, a step on more ranks is no shorter than one rank's
(weak scaling's efficiency t(1 rank) / t(n ranks) is at most 1: Gustafson 1988's setting,
the data-parallel step of Li et al. 2020); and the step across a link is the step measured
inside one node plus what the link adds to its all-reduce (``cluster.ddp_across_links``:
alpha-beta, Hockney 1994, on the link's measured latency and rate), within 1.5x. The table's
numbers are each run's fastest step after the first (``cluster_predict.step_parts``); the
verdicts take that number and the half-spread of the run's steps as its noise, so a row whose
steps swing says so instead of "holds". Torch-free.
"""

from __future__ import annotations

from typing import Any

from labkit.analysis.claims import Claim, Sample, Verdict, judge
from labkit.lessons.machine import load_now, why_not

PREDICTION_FACTOR = 1.5
"""How far (as a factor) a measured step may sit from the predicted one for the model to hold."""
ONE = "1 rank"
"""The name of the one-rank run (``ddp_across_links``'s results)."""
IN_NODE = "1 node x 2 ranks"
"""The name of the in-node run: 2 ranks of one node, loopback between them."""


def steady_s(result: Any) -> list[float]:
    """The run's step times after the first (all of them when there is one)."""
    times = result.timeline.step_times_s()
    return times[1:] or times


def fastest_s(result: Any) -> float:
    """The fastest steady step: the number the table shows (``step_parts``)."""
    return min(steady_s(result))


def _measured(ddp: dict[str, Any]) -> list[dict[str, Any]]:
    """The multi-rank rows whose run this machine made (the emulated ones only where it can)."""
    return [r for r in ddp["rows"] if r["name"] != ONE and r.get("step_s") is not None
            and r["name"] in ddp["results"]]


def weak_scaling_verdicts(ddp: dict[str, Any]) -> list[Verdict]:
    """Per measured multi-rank row: t(1 rank) / each steady step, the largest (the table's
    efficiency) +- half their spread, at most 1."""
    one = fastest_s(ddp["results"][ONE])
    return [judge(Sample.of([one / t for t in steady_s(ddp["results"][r["name"]])], "max"),
                  Claim.below(1.0, "with the same batch per rank a step on more ranks is no "
                                   "shorter than one rank's"),
                  f"{r['name']}: efficiency t(1 rank) / t", fmt=".2f")
            for r in _measured(ddp)]


def predicted_rows(ddp: dict[str, Any]) -> list[dict[str, Any]]:
    """The measured rows with a predicted step (across a link), in ``prediction_verdicts``'
    order."""
    return [r for r in _measured(ddp) if r.get("predicted_step_s")]


def prediction_verdicts(ddp: dict[str, Any]) -> list[Verdict]:
    """Per measured row across a link: its fastest step (ms) +- half its steps' spread,
    within ``PREDICTION_FACTOR`` of the predicted step."""
    return [judge(Sample.of([t * 1e3 for t in steady_s(ddp["results"][r["name"]])], "min"),
                  Claim.within_factor(r["predicted_step_s"] * 1e3, PREDICTION_FACTOR,
                                      "the step across the link is the in-node step plus what "
                                      "the link adds to its all-reduce"),
                  f"{r['name']}: step (ms, the fastest)", fmt=".1f")
            for r in predicted_rows(ddp)]


def ddp_text(ddp: dict[str, Any]) -> str:
    """Every verdict on the DDP rows, each miss with why and its replay on dedicated cores."""
    from labkit.lessons.replayed import again

    results, lines = ddp["results"], []
    rows = _measured(ddp)
    pairs = list(zip(rows, weak_scaling_verdicts(ddp)))
    pairs += list(zip(predicted_rows(ddp), prediction_verdicts(ddp)))
    for row, v in pairs:
        lines.append(v.sentence())
        if v.holds:
            continue
        run = results[row["name"]]
        if "efficiency" in v.what:
            lines.append("  " + again(v.what, lambda one, n: fastest_s(one) / fastest_s(n),
                                      [results[ONE], run], v.sample.value))
        else:
            lines.append("  " + again(v.what, lambda r: fastest_s(r) * 1e3, [run],
                                      v.sample.value, ".1f"))
            if v.sample.value < row["predicted_step_s"] * 1e3 and row.get("comm_s"):
                hidden = row["comm_s"] - row["exposed_s"]
                lines.append(f"  the prediction charges the link's whole all-reduce; in its "
                             f"fastest step this run hid {hidden * 1e3:.1f} ms of its "
                             f"{row['comm_s'] * 1e3:.1f} ms under the backward (its trace)")
        lines.append("  " + why_not(load_now(), 2))
    return "\n".join(lines) or "no multi-rank DDP run was measured here: nothing to judge"
