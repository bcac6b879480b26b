"""Lesson 06's sentences: what this run showed about the alpha-beta fit, compression and
overlap, each beside its rule.

The rules: the alpha-beta model (Hockney 1994; the ring all-reduce cost of Thakur et al.
2005) fitted on a few sizes predicts the others; a compressor cuts the wire bytes by the
factor its shapes give (fp16 2x, int8 4x, PowerSGD per Vogels et al. 2019, top-k / random-k
per Stich et al. 2018); DDP's small buckets hide communication under backward (Li et al.
2020) while tensor parallelism's all-reduces cannot hide. Bytes are exact and do not depend
on the machine; times do, and on two shared cores a millisecond all-reduce can wait for a
core as long as it transfers, so a time that contradicts a rule is explained, not trusted.
Torch-free: reads the rows of ``labkit.lessons.compression``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from labkit.analysis.claims import Claim, Sample, Verdict, judge
from labkit.lessons.machine import load_now, why_not
from labkit.lessons.measure import SINGLE_RUN_NOISE

FIT_HOLDS = 0.3
"""Largest relative error on a held-out size for which the fit still predicts it."""
STEP_FACTOR = 1.5
"""How far (as a factor) a measured DDP step may sit from the no-overlap alpha-beta step for
the model to hold: it leaves out overlap and the optimizer, each worth tens of percent."""
HIDES = 0.1
"""Share of communication under compute that counts as hidden (more than timing noise)."""


def fit_verdict(reports: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> Verdict:
    """The worst held-out error of each repeat, their median, below ``FIT_HOLDS``."""
    runs = [reports] if isinstance(reports, Mapping) else list(reports)
    return judge(Sample.of([float(r["max_holdout_error"]) for r in runs], "median"),
                 Claim.below(FIT_HOLDS, "alpha-beta fitted on some sizes predicts the others"),
                 "worst held-out error", fmt=".0%")


def fit_text(reports: Mapping[str, Any] | Sequence[Mapping[str, Any]],
             world_size: int = 2) -> str:
    """The fitted alpha and bandwidth, and whether they predict the held-out sizes: the worst
    held-out error of each repeat (``compression.repeat_fit``), judged over the repeats."""
    runs = [reports] if isinstance(reports, Mapping) else list(reports)
    shown = sorted(runs, key=lambda r: r["max_holdout_error"])[(len(runs) - 1) // 2]
    fit = shown["fit"]
    lines = [f"fit: alpha {fit.alpha_s * 1e6:.0f} us per message, bandwidth "
             f"{fit.bandwidth_Bps / 1e9:.2f} GB/s (the repeat with the median error, of "
             f"{len(runs)})"]
    verdict = fit_verdict(runs)
    lines.append(verdict.sentence())
    if not verdict.holds:
        held = [r for r in shown["rows"] if not r["used_for_fit"]]
        worst = max(held, key=lambda r: r["rel_error"])
        lines.append(f"the fit missed the held-out {worst['bytes'] / 1e6:.0f} MB by "
                     f"{worst['rel_error']:.0%} (measured {worst['measured_s'] * 1e3:.2f} ms, "
                     f"predicted {worst['predicted_s'] * 1e3:.2f}): an all-reduce that waited "
                     f"for a core is off by what it waited; "
                     + why_not(load_now(), world_size))
        lines.append("  no dedicated-core replay of the fit: a replay's wire is itself an "
                     "alpha-beta fit of this machine's all-reduce, so replaying the benchmark "
                     "would only give the fit back")
    return "\n".join(lines)


def compression_text(comp: Mapping[str, Any]) -> str:
    """Per method: bytes against the prediction (exact or not), then which methods saved
    time over ``none`` on this run, and the loss each ended at."""
    rows = {r["method"]: r for r in comp["rows"]}
    exact = [m for m, r in rows.items() if r["wire_bytes"] == r["predicted_wire_bytes"]]
    off = [m for m in rows if m not in exact]
    lines = [("every method sent exactly the predicted bytes" if not off else
              f"bytes differ from the prediction for {', '.join(off)}: report this run")]
    if "none" in rows:
        base = rows["none"]
        sides = _against_none(rows)
        comm = _comm_ms(comp.get("results", {}).get("none"))
        lines.append(f"steps beside no compression's {base['step_time_s'] * 1e3:.1f} ms, one run "
                     f"each (+-{2 * SINGLE_RUN_NOISE:.0%} of noise on a ratio): "
                     + "; ".join(f"{side}: {', '.join(ms)}" for side, ms in sides.items() if ms)
                     + (f" -- its all-reduce took {comm:.1f} ms of the step: compression can "
                        f"save at most that, and compressing costs compute" if comm is not None
                        else ""))
        worst = max(rows.values(), key=lambda r: r["final_loss"] - base["final_loss"])
        lines.append(f"final losses stay within {worst['final_loss'] - base['final_loss']:+.3f} "
                     f"of no compression (largest: {worst['method']})")
    return "\n".join(lines)


def _against_none(rows: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    """Each method's step against no compression's, one run each: shorter or longer only
    beyond ``one_run_ratio``'s noise band, else within the noise."""
    from labkit.lessons.measure import one_run_ratio

    sides: dict[str, list[str]] = {"shorter": [], "within the noise": [], "longer": []}
    base = rows["none"]["step_time_s"]
    for m, r in rows.items():
        if m == "none":
            continue
        s = one_run_ratio(base / r["step_time_s"])
        side = ("shorter" if s.value - s.noise > 1 else "longer" if s.value + s.noise < 1
                else "within the noise")
        sides[side].append(m)
    return sides


def _comm_ms(result: Any) -> float | None:
    """Communication per step of a run (steady-state steps, mean over ranks), ms."""
    if result is None:
        return None
    w = result.timeline.window()
    return w.comm_s() / max(len(w.steps()), 1) * 1e3


def _ddp_pair(rows: Sequence[Mapping[str, Any]]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    ddp = [r for r in rows if not str(r["name"]).startswith("tp")]
    return (min(ddp, key=lambda r: r["bucket_cap_mb"]), max(ddp, key=lambda r: r["bucket_cap_mb"]))


def overlap_verdict(rows: Sequence[Mapping[str, Any]]) -> Verdict:
    """The smallest bucket's hidden share minus one big bucket's, as the figure draws them
    (each run's steady steps), above ``HIDES``; the noise is the half-spread of the same
    difference step by step (``overlap_per_step``; nan where a row has none)."""
    small, big = _ddp_pair(rows)
    value = small["overlap_fraction"] - big["overlap_fraction"]
    per = [a - b for a, b in zip(small.get("overlap_per_step") or [],
                                 big.get("overlap_per_step") or [])]
    noise = (max(per) - min(per)) / 2 if len(per) > 1 else math.nan
    return judge(Sample(value, noise, tuple(per)),
                 Claim.above(HIDES, "small buckets start all-reducing during backward, so they "
                                    "hide more of it than one big bucket"),
                 "share hidden, smallest bucket minus one big bucket", fmt=".2f")


def _hidden(run: Any) -> float:
    return float(run.timeline.window().overlap_fraction())


def _again(what: str, read: Any, rows: Sequence[Mapping[str, Any]], measured: float,
           fmt: str = ".2f") -> str:
    """``read`` on the rows' runs replayed on dedicated cores, or why there is no replay."""
    from labkit.lessons.replayed import again

    runs = [r.get("run") for r in rows]
    if any(r is None for r in runs):
        return f"{what}: no dedicated-core replay (the row keeps no run to replay)"
    return again(what, read, runs, measured, fmt)


def overlap_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """The hidden share of each run's communication; the rule is that DDP's smallest bucket
    hides more than its single big bucket, and TP (a row named ``tp...``) hides nothing."""
    ddp = [r for r in rows if not str(r["name"]).startswith("tp")]
    tp = [r for r in rows if str(r["name"]).startswith("tp")]
    lines = ["  ".join(f"{r['name']}: {r['overlap_fraction']:.0%} hidden" for r in rows)]
    small, big = min(ddp, key=lambda r: r["bucket_cap_mb"]), max(ddp, key=lambda r: r["bucket_cap_mb"])
    verdict = overlap_verdict(rows)
    lines.append(verdict.sentence())
    if verdict.holds:
        lines.append(f"small buckets started communicating during backward and hid "
                     f"{small['overlap_fraction']:.0%}; one big bucket waited for the whole "
                     f"backward and hid {big['overlap_fraction']:.0%}")
    else:
        lines.append("  " + _again("share hidden, smallest bucket minus one big bucket",
                                   lambda a, b: _hidden(a) - _hidden(b), [small, big],
                                   verdict.sample.value))
        lines.append("gloo's threads and the backward take turns on the same cores; "
                     + why_not(load_now(), 2))
    for r in tp:
        lines.append(f"{r['name']}: {r['overlap_fraction']:.0%} hidden -- "
                     + ("each all-reduce sat between dependent matmuls" if r["overlap_fraction"]
                        < HIDES else "more than the rule allows; " + why_not(load_now(), 2)))
    return "\n".join(lines)


def step_verdict(predicted: Any, row: Mapping[str, Any]) -> Verdict:
    """The row's steady steps (ms: their median, half their spread the noise) within
    ``STEP_FACTOR`` of the no-overlap alpha-beta step."""
    want = predicted.total_s * 1e3
    steps = [t * 1e3 for t in row.get("step_times_s") or [row["step_time_s"]]]
    return judge(Sample.of(steps, "median"),
                 Claim.within_factor(want, STEP_FACTOR, f"the no-overlap alpha-beta model "
                                     f"predicts the DDP step ({want:.1f} ms) within "
                                     f"{STEP_FACTOR:g}x"),
                 f"measured step (median of {len(steps)}, ms)", fmt=".1f")


def _waited(wire: float, row: Mapping[str, Any]) -> str:
    """Where a step's all-reduce time went beyond the fitted wire: waiting for the other rank
    to reach the call (``peer_wait_s``), then the call itself once both were in it."""
    comm = row["comm_s"] * 1e3
    wait = row.get("peer_wait_s")
    if wait is None:
        return (f"the all-reduce took {comm:.1f} ms where the fitted wire needs {wire:.1f} -- "
                + why_not(load_now(), 2))
    wait *= 1e3
    inside = comm - wait
    line = (f"the all-reduce took {comm:.1f} ms a step where the fitted wire needs {wire:.1f}: "
            f"{wait:.1f} ms of it a rank waited for the other to reach the call, {inside:.1f} "
            f"ms the call took once both were in it")
    if inside > STEP_FACTOR * wire:
        return line + " -- " + why_not(load_now(), 2)
    if wait >= inside - wire:  # the larger part of the excess names the cause
        call = ("the wire behaved as fitted" if inside <= 1.1 * wire else
                f"the call took {inside / wire:.2f}x the fitted wire")
        return (line + f"; {call}: most of the excess was the ranks reaching the all-reduce at "
                "different times, which the model, starting both at once, leaves out")
    return (line + f"; most of the excess was inside the call ({inside / wire:.2f}x the fitted "
            f"wire) -- " + why_not(load_now(), 2))


def step_text(predicted: Any, row: Mapping[str, Any]) -> str:
    """The alpha-beta step prediction (no overlap) against the measured steps of ``row``:
    a verdict over the run's steady-state steps (``step_times_s``; the median, with the
    half-spread of the steps as its noise), then what the gap is made of when it misses."""
    want = predicted.total_s * 1e3
    steps = [t * 1e3 for t in row.get("step_times_s") or [row["step_time_s"]]]
    verdict = step_verdict(predicted, row)
    got = verdict.sample.value
    line = f"{verdict.sentence()} ({got / want:.2f}x the prediction)"
    if verdict.holds:
        return line
    if got > want:  # above the band, or above the prediction and inside the noise
        line += "; " + _waited(predicted.comm_s * 1e3, row)
    elif got < want / STEP_FACTOR:
        line += (f"; the run beat the no-overlap model -- {row['overlap_fraction']:.0%} of its "
                 f"communication hid under compute")
    return line + "\n  " + _again(f"measured step (median of {len(steps)}, ms)",
                                  lambda r: r.step_time_s * 1e3, [row], got, ".1f")
