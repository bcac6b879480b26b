"""Lesson 11's experiment: BSP, ASP and SSP, without and with a straggler, on real ranks.

Six ``labkit run ps`` runs on the same data and the same number of samples (every worker
takes ``steps`` steps): each consistency model, first with equal workers, then with the
last worker computing ``factor`` times slower. For each run the table gives

* how fast gradients flowed **while every worker was still computing**
  (``gradient_rate``): every worker takes the same number of steps, so under ASP the fast
  worker finishes first and the straggler then runs alone; a rate over the whole run would
  end at the straggler's pace under every model and hide what the lesson is about;
* how stale the gradients were (mean and max);
* the **time to reach the target loss** (``records.time_to_loss``: the loss averaged over
  the last dozen gradients, so every model is smoothed over the same samples);
* the **price of staleness**: the loss at the end (the loss figure's last point: the mean of
  the last 12 gradients the server applied,
  the same samples for every run) and how far the final weights are from synchronous SGD
  on the same data (``max_abs_diff_vs_reference``: 0 up to rounding for BSP).

Each worker's batch is large enough (4096 samples) that computing a gradient costs several
times a message round trip: that is when a parameter server is worth having, and when a
straggler hurts. The sentences the lesson prints (``race_text``, ``staleness_text``,
``price_text``) are computed from the runs, and say so when a run contradicts the rule.
Torch-free: it only starts runs and reads their timelines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from labkit.base.progress import each
from labkit.config.run import ModelConfig, RunConfig
from labkit.lessons.async_ps_rates import (
    _arrivals,
    _window,
    gradient_rate,
    realized_factor,
    straggler_staleness,
)
from labkit.lessons.machine import Load, load_now, sharing_cores, why_not
from labkit.strategies.ps.records import time_to_loss
from labkit.theory.rounding import same_weights_tolerance
from labkit.visuals.ps import loss_curve

LESSON_MODEL = ModelConfig(width=128, depth=2)
LESSON_RUN: dict[str, Any] = {"strategy": "ps", "world_size": 3, "steps": 40, "lr": 0.4,
                              "batch_size": 4096, "model": LESSON_MODEL, "backend": "gloo",
                              "progress": False, "check_reference": True, "timeout_s": 180}
"""1 server + 2 workers (three processes: on two cores nobody waits for a core while the
straggler idles), 40 steps of 4096 samples per worker, SGD at 0.4."""
TARGET_LOSS = 2.1
"""The loss the lesson races to (from about 2.3 at the start): BSP gets there about half-way
through its run, so ASP's fast worker, 4x quicker, gets there while it still runs (after it
finishes its 40 steps the straggler trains alone, at the straggler's pace)."""
SYNC_TOLERANCE = same_weights_tolerance("sgd", 0.4, 40)
"""|w - w_sync| below which BSP counts as synchronous SGD (1.6e-4, the lab's one tolerance:
``labkit.theory.rounding``): the server sums 2 x 4096 samples' gradients in another order
than one process does, and 40 steps of that float rounding reach about 1e-5 (1.6e-5
measured); a wrong update rule is off by 1e-3 or more."""


@dataclass
class PSExperiment:
    runs: dict[str, Any]
    """Name ("asp, straggler") -> the RunResult."""
    target: float
    settings: dict[str, Any] = field(default_factory=dict)
    load: Load | None = None
    """The machine's load just before the runs (for the sentences that explain a surprise)."""

    def row(self, name: str) -> dict[str, Any]:
        res = self.runs[name]
        m = res.metrics
        curve = loss_curve(m)[1] if m.get("loss_vs_time") else []
        tail = curve[-1:] or res.losses[-max(1, len(res.losses) // 8):]
        rate = gradient_rate(res)
        return {"run": name, "updates": m["updates"], "updates_per_s": m["updates_per_s"],
                "gradients_per_s": rate["rate"], "mean_staleness": m["mean_staleness"],
                "max_staleness": m["max_staleness"],
                "time_to_target_s": time_to_loss(m, self.target),
                "final_loss": sum(tail) / len(tail),  # the loss figure's last point
                "diff_vs_sync": m.get("max_abs_diff_vs_reference", math.nan)}

    def fast_worker_done_s(self, name: str) -> float | None:
        """When (seconds on the loss curve's clock: server 0's first request) the first worker
        to finish had pushed its last gradient in run ``name``; None without that run."""
        res = self.runs.get(name)
        if res is None:
            return None
        arrivals = _arrivals(res)
        if not arrivals:
            return None
        start, end = _window(res, arrivals)
        requests = [e.end_ns for e in res.timeline.events if e.rank == 0
                    and e.name == "request"]
        return (end - min(requests, default=start)) / 1e9

    def table(self) -> list[dict[str, Any]]:
        return [self.row(name) for name in self.runs]

    def text(self) -> str:
        """The table as aligned text (print it in a notebook)."""
        head = (f"{'run':<16}{'grad/s':>8}{'stale':>7}{'max':>5}"
                f"{'t to ' + format(self.target, 'g') + ' (s)':>14}{'final loss':>12}"
                f"{'|w - w_sync|':>14}")
        lines = [head]
        for r in self.table():
            t = "never" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.2f}"
            lines.append(f"{r['run']:<16}{r['gradients_per_s']:>8.0f}"
                         f"{r['mean_staleness']:>7.2f}{r['max_staleness']:>5}{t:>14}"
                         f"{r['final_loss']:>12.4f}{r['diff_vs_sync']:>14.2g}")
        lines.append("grad/s: gradients the server received per second while every worker "
                     "was still computing")
        return "\n".join(lines)


def consistency_experiment(*, factor: float = 4.0, bound: int = 2, target: float = TARGET_LOSS,
                           consistencies: tuple[str, ...] = ("bsp", "asp", "ssp"),
                           show: bool = False, **overrides: Any) -> PSExperiment:
    """Run every consistency model without and with a straggler (the last worker). ``show``
    prints a line as each run lands (a lesson's progress: the runs take a while)."""
    from labkit.api import run

    common = {**LESSON_RUN, **overrides}
    last = common["world_size"] - 1
    load = load_now()
    runs: dict[str, Any] = {}
    total = 2 * len(consistencies)
    variants = [(s, c) for s in ("", f"{last}:{factor:g}") for c in consistencies]

    def label(variant: tuple[str, str]) -> str:
        return f"{variant[1]}{', straggler' if variant[0] else ''}"

    # ``show`` adds the lesson's own line as each run lands; the bar's clock moves meanwhile
    for straggler, consistency in each(variants, "consistency models", name=label):
        options: dict[str, Any] = {"servers": 1, "consistency": consistency,
                                   "straggler": straggler}
        if consistency == "ssp":
            options["staleness"] = bound
        name = label((straggler, consistency))
        with sharing_cores():  # 3 ranks on 2 cores: the lesson says it, and why
            runs[name] = run(RunConfig(**common, options=options))
        if show:
            res = runs[name]
            print(f"  run {len(runs)} of {total}: {name:<15} {res.metrics['updates']:>3} "
                  f"updates in {res.wall_s:.1f} s", flush=True)
    return PSExperiment(runs, target, {"factor": factor, "bound": bound,
                                       "straggler_rank": last, **common}, load)


def _rate_formula(w: int, f: float) -> float:
    return ((w - 1) * f + 1) / w


def straggler_predictions(exp: PSExperiment) -> list[dict[str, Any]]:
    """The two formulas of the lesson next to the runs with the straggler.

    With W workers, one F times slower than the others and compute the only cost:

    * BSP moves at the straggler's pace: W gradients per slow step t_slow. ASP takes every
      gradient as it comes: (W - 1) fast workers at F / t_slow each plus the slow one, so
      ASP / BSP gradients per second = ((W - 1) F + 1) / W (measured while every worker
      still runs: ``gradient_rate``);
    * while the straggler computes one gradient, the W - 1 fast workers push F each: its
      gradients arrive (W - 1) F updates late under ASP (SSP bounds it through the clock
      gap). Only while the fast workers still run: they finish their steps first, and the
      straggler's last gradients are fresh; so the measurement is the median over the
      straggler's gradients that arrived while the others ran (``straggler_staleness``; the
      largest staleness of the run is in the table, and includes the first step's warm-up).

    ``predicted`` uses the factor asked for; ``predicted_realized`` the factor the straggler
    really had (``realized_factor``). Messages cost time too, which the formulas leave out.
    """
    w = exp.settings["world_size"] - 1
    f = exp.settings["factor"]
    real = realized_factor(exp)
    bsp, asp = exp.runs["bsp, straggler"], exp.runs["asp, straggler"]
    typical = straggler_staleness(exp)
    return [{"quantity": "ASP / BSP gradients per second", "predicted": _rate_formula(w, f),
             "predicted_realized": _rate_formula(w, real),
             "measured": gradient_rate(asp)["rate"] / max(gradient_rate(bsp)["rate"], 1e-12)},
            {"quantity": "ASP: staleness of the straggler's gradients", "predicted": (w - 1) * f,
             "predicted_realized": (w - 1) * real,
             "measured": asp.metrics["max_staleness"] if typical is None else typical}]


def predictions_text(exp: PSExperiment) -> str:
    """The predictions table as the lesson prints it, with the straggler's real factor."""
    f, real = exp.settings["factor"], realized_factor(exp)
    lines = [f"{'':<44}{'F = ' + format(f, 'g') + ' (asked)':>16}"
             f"{'F = ' + format(real, '.1f') + ' (real)':>16}{'measured':>10}"]
    for row in straggler_predictions(exp):
        lines.append(f"{row['quantity']:<44}{row['predicted']:>16.2f}"
                     f"{row['predicted_realized']:>16.2f}{row['measured']:>10.2f}")
    return "\n".join(lines)


def race_text(exp: PSExperiment) -> str:
    """Who reached the target loss first, with equal workers and with the straggler, as
    this run measured it, then the verdicts with the straggler (``verdict_lines``)."""
    rows = {r["run"]: r for r in exp.table()}
    lines = []
    for suffix, label in (("", "equal workers"), (", straggler", "with the straggler")):
        times = {c: rows[c + suffix]["time_to_target_s"] for c in ("bsp", "asp", "ssp")
                 if c + suffix in rows}
        reached = {c: t for c, t in times.items() if t is not None}
        if not reached:
            lines.append(f"{label}: no model reached loss {exp.target:g} in this run")
            continue
        order = sorted(reached, key=lambda c: reached[c])
        shown = ", ".join(f"{c.upper()} {t:.2f} s" if t is not None else f"{c.upper()} never"
                          for c, t in times.items())
        # the loss is read once a gradient: a lead shorter than one gradient's interval is
        # not a lead (equal workers read BSP 0.35 s, ASP and SSP 0.36 s: "BSP first")
        tick = max(_interval_s(exp.runs[c + suffix]) for c in order[:2])
        if len(order) > 1 and reached[order[1]] - reached[order[0]] <= tick:
            lines.append(f"{label}: reached loss {exp.target:g} together, within one "
                         f"gradient's interval ({tick:.2f} s; {shown})")
        else:
            lines.append(f"{label}: {order[0].upper()} reached loss {exp.target:g} first "
                         f"({shown})")
    if all(f"{c}, straggler" in exp.runs for c in ("asp", "bsp")):
        lines.extend(verdict_lines(exp))
    return "\n".join(lines)


def _interval_s(run: Any) -> float:
    """The median time between two points of ``run``'s loss curve: how finely it can tell
    when a loss was reached."""
    import statistics

    t = [p[0] for p in run.metrics.get("loss_vs_time", [])]
    gaps = [b - a for a, b in zip(t, t[1:]) if b > a]
    return statistics.median(gaps) if gaps else 0.0


ASP_NOT_REPLAYED = ("no dedicated-core replay of this ratio: ASP's server applies gradients in "
                    "the order they arrived in this run, and a replay keeps that order, so it "
                    "cannot say what ASP does with a core per rank (the figure below replays the "
                    "BSP run, whose order is fixed by the rule)")
"""What a missed race or rate verdict says instead of a replayed ratio."""


def verdict_lines(exp: PSExperiment) -> list[str]:
    """The race's and the gradient rate's verdicts with the straggler
    (``labkit.lessons.async_ps_verdicts``); for one that is not "holds", why the run may have
    missed, and why its ratio has no replay (``ASP_NOT_REPLAYED``)."""
    from labkit.lessons.async_ps_verdicts import race_verdict, rate_verdict

    lines = []
    for verdict in (race_verdict(exp), rate_verdict(exp)):
        lines.append(verdict.sentence())
        if not verdict.holds:
            lines.append("  " + why_not(exp.load or load_now(), exp.settings["world_size"]))
            lines.append("  " + ASP_NOT_REPLAYED)
    return lines


def staleness_text(exp: PSExperiment) -> str:
    """What the table says about staleness, per model, read from this run."""
    rows = {r["run"]: r for r in exp.table()}
    out = []
    bsp = [r for n, r in rows.items() if n.startswith("bsp")]
    if bsp:
        worst = max(r["diff_vs_sync"] for r in bsp)
        stale = max(r["max_staleness"] for r in bsp)
        out.append(f"BSP: largest staleness {stale}, |w - w_sync| at most {worst:.1g}"
                   + (" -- synchronous SGD up to float rounding" if stale == 0 and worst < SYNC_TOLERANCE
                      else " -- NOT synchronous SGD: report this run"))
    ssp = [exp.runs[n].metrics for n in rows if n.startswith("ssp")]
    if ssp:
        k = exp.settings["bound"]
        # Ho et al.'s SSP bounds the clock gap between the fastest and slowest worker; a
        # run that reports it is held to it, else to the staleness in updates
        key, what = (("max_clock_gap", "clock gap") if all("max_clock_gap" in m for m in ssp)
                     else ("max_staleness", "staleness"))
        worst = max(m[key] for m in ssp)
        out.append(f"SSP(s={k}): largest {what} {worst}"
                   + (" -- within its bound" if worst <= k else f" -- ABOVE its bound {k}"))
    asp = rows.get("asp, straggler")
    if asp:
        out.append(f"ASP with the straggler: largest staleness {asp['max_staleness']}, "
                   f"mean {asp['mean_staleness']:.2f}")
    return "\n".join(out)


def price_text(exp: PSExperiment) -> str:
    """The price of staleness in this run: final loss and distance from synchronous SGD."""
    rows = {r["run"]: r for r in exp.table()}
    b, a = rows.get("bsp, straggler"), rows.get("asp, straggler")
    if not (a and b):
        return ""
    worse = a["final_loss"] - b["final_loss"]
    # how far BSP's own curve moved over its last point: a gap smaller than that is not a
    # price (lesson 11 printed "ASP ended 0.001 higher" of 1.28, as "the rule" it teaches)
    m = exp.runs["bsp, straggler"].metrics
    curve = loss_curve(m)[1] if m.get("loss_vs_time") else []
    moved = abs(curve[-1] - curve[-2]) if len(curve) > 1 else 0.0
    verdict = (f"ASP and BSP ended {abs(worse):.4f} apart, less than BSP's own loss moved over "
               f"its last point ({moved:.4f}): the final loss does not show the price here, "
               f"the distance from synchronous SGD does" if abs(worse) <= moved else
               f"ASP ended {worse:.3f} higher in loss than BSP on the same samples"
               if worse > 0 else
               f"ASP ended {-worse:.3f} LOWER in loss than BSP this time (a stale gradient "
               f"can land well by luck; the distance from synchronous SGD still shows it)")
    return (f"with the straggler: final loss BSP {b['final_loss']:.4f}, ASP "
            f"{a['final_loss']:.4f}: {verdict}; |w - w_sync| BSP {b['diff_vs_sync']:.1g}, "
            f"ASP {a['diff_vs_sync']:.1g}")


def waits_text(exp: PSExperiment) -> str:
    """How long each worker waited for its pulls in the runs with the straggler (the price
    BSP and SSP pay for waiting; ASP answers every pull at once)."""
    lines = []
    for c in ("bsp", "asp", "ssp"):
        res = exp.runs.get(f"{c}, straggler")
        if res is None:
            continue
        waits = res.metrics.get("pull_wait_s_per_worker", [])
        shown = ", ".join(f"worker {i}{' (slow)' if i == len(waits) - 1 else ''} {w:.2f} s"
                          for i, w in enumerate(waits))
        lines.append(f"{c.upper()} with the straggler, seconds spent waiting for pulls: {shown}")
    return "\n".join(lines)
