"""The parameter-server race of lesson 11: with a straggler, does ASP reach the target loss
sooner in wall-clock time than BSP? And how stale do gradients get?

Runs lesson 11's experiment (``labkit.lessons.async_ps.consistency_experiment``:
BSP, ASP and SSP(s), without and with the last worker ``--factor`` times slower; 1 server
and 2 workers unless ``--workers`` says otherwise) ``--rounds`` times, and prints per run
its table (updates per second, staleness mean and max, time to the target loss, final loss,
distance from synchronous SGD), then the medians of the time to the target over the rounds
and the staleness histograms of the last round. Checks, each round: BSP never stale and equal
to synchronous SGD (|w - w_sync| below the lesson's ``SYNC_TOLERANCE``), SSP's reads within s
clocks of the slowest worker (``max_clock_gap``, Ho et al. 2013), ASP stale; and prints ASP /
BSP gradients per second with the straggler for every round (lesson 11's bar: >= 1.5).

Goal: with the straggler, median time to target ASP < BSP.
Usage: ``python bench/bench_ps.py [--rounds 3] [--factor 4] [--workers 2]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from labkit.lessons.async_ps import (
    SYNC_TOLERANCE,
    TARGET_LOSS,
    consistency_experiment,
    straggler_predictions,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--factor", type=float, default=4.0, help="how many times slower")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--bound", type=int, default=2, help="SSP's staleness s (clocks)")
    ap.add_argument("--target", type=float, default=TARGET_LOSS)
    args = ap.parse_args()
    times: dict[str, list[float]] = {}
    failures = []
    exp = None
    ratios: list[float] = []
    for i in range(args.rounds):
        exp = consistency_experiment(factor=args.factor, bound=args.bound, target=args.target,
                                     world_size=args.workers + 1)
        print(f"--- round {i + 1} of {args.rounds} ---\n{exp.text()}", flush=True)
        for row in exp.table():
            t = row["time_to_target_s"]
            times.setdefault(row["run"], []).append(float("inf") if t is None else t)
            if row["run"].startswith("bsp") and (row["max_staleness"] != 0
                                                 or row["diff_vs_sync"] > SYNC_TOLERANCE):
                failures.append(f"round {i + 1}: {row['run']} is not synchronous SGD")
            gap = exp.runs[row["run"]].metrics["max_clock_gap"]
            if row["run"].startswith("ssp") and gap > args.bound:
                failures.append(f"round {i + 1}: {row['run']} read {gap} clocks ahead, "
                                f"s={args.bound}")
            if row["run"].startswith("asp") and row["mean_staleness"] <= 0:
                failures.append(f"round {i + 1}: {row['run']} had no stale gradient")
        ratios += [r["measured"] for r in straggler_predictions(exp)
                   if r["quantity"] == "ASP / BSP gradients per second"]
    assert exp is not None
    print(f"\n1 server + {args.workers} workers, straggler x{args.factor:g}, target loss "
          f"{args.target:g}, {args.rounds} rounds, {os.cpu_count()} CPUs")
    med = {name: statistics.median(v) for name, v in times.items()}
    for name, v in times.items():
        print(f"  {name:<18} time to target median {med[name]:6.2f} s   rounds: "
              + ", ".join(f"{x:.2f}" for x in v))
    for name, res in exp.runs.items():
        print(f"  staleness histogram {name:<18} {res.metrics['staleness_hist']}   clock gaps "
              f"{res.metrics['clock_gap_hist']}")
    for row in straggler_predictions(exp):
        print(f"  {row['quantity']:<44} predicted {row['predicted']:.2f}  measured "
              f"{row['measured']:.2f} (last round)")
    print("  ASP / BSP gradients per second, every round: "
          + ", ".join(f"{r:.2f}" for r in ratios)
          + f" (lesson 11's bar: >= 1.5 in every round; {min(ratios):.2f} at worst)")
    ok = med["asp, straggler"] < med["bsp, straggler"]
    print(f"  with the straggler ASP {'reaches' if ok else 'does NOT reach'} the target sooner "
          f"than BSP: {med['asp, straggler']:.2f} s vs {med['bsp, straggler']:.2f} s")
    if failures:
        sys.exit("\n".join(failures))


if __name__ == "__main__":
    main()
