"""Span by span: where the lab's hybrid layouts spend their CPU, beside the planner's parts.

    python bench/bench_plan_spans.py [--rounds 2] [--steps 10] [--only NAME ...]

Issue 38, item 4: the planner on this machine (``labkit.theory.plan_machine``) charges a
step on shared cores at least every rank's CPU over the cores, in three parts
(``work_parts``): the FLOPs at the engine's rate, the engine's fixed work, and the
collectives' CPU. This bench runs each layout of ``plan_lab.LAYOUTS`` (the order reversed
every other round) and splits what every rank really used, added up over the ranks (each
rank's median over its steps, the first two skipped):

* in compute spans: their thread CPU times (a tensor-parallel all-reduce runs inside the
  forward's span, so its calling thread's CPU counts here);
* the rest of the rank's process CPU in the step: collectives, their threads, the loop's glue;

beside the predicted compute + fixed work and collectives' CPU from the cached step cost
(``labkit.lessons.plan_local.step_cost``: measured first where none is cached), the step's
period, and every rank's CPU over the cores: a period above that is time the cores sat idle
with ranks left to run, which the planner's work-law bound does not charge. Also printed:
the compute spans' CPU by op, and the collectives' wall time by grid axis.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from typing import Any

import labkit
from labkit.lessons.machine import load_now
from labkit.lessons.plan_local import run_kwargs, step_cost
from labkit.theory.plan_lab import LAB_GPT, LAYOUTS, lab_calls
from labkit.theory.plan_machine import work_parts

SKIP_STEPS = 2
"""Steps left out at the start of each run (warm-up)."""


def per_step(result: Any) -> dict[str, Any]:
    """Every rank's CPU of a step added up, and its parts (see the module docstring)."""
    compute: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    by_op: dict[str, float] = defaultdict(float)
    by_axis: dict[str, float] = defaultdict(float)
    steps = set()
    for e in result.timeline:
        if not e.step or e.step < SKIP_STEPS:
            continue
        steps.add(e.step)
        if e.lane.value == "compute":
            cpu = (e.cpu_ns if e.cpu_ns is not None else e.dur_ns) / 1e9
            compute[e.rank][e.step] += cpu
            by_op[e.op.value] += cpu
        elif e.lane.value == "comm":
            by_axis[e.axis or "?"] += e.dur_ns / 1e9
    total = sum(statistics.median(o.record.step_cpu_seconds[SKIP_STEPS:])
                for o in result.outputs)
    in_compute = sum(statistics.median(compute[r].values()) for r in compute)
    n = max(1, len(steps))
    return {"cpu": total, "compute": in_compute,
            "by_op": {k: v / n for k, v in sorted(by_op.items())},
            "by_axis": {k: v / n for k, v in sorted(by_axis.items())},
            "period": result.timeline.median_step_period_s()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--only", nargs="*", default=None,
                   help="layout names to run (default: the hybrids)")
    args = p.parse_args()
    if args.steps <= SKIP_STEPS:
        p.error(f"--steps ({args.steps}) must be above the {SKIP_STEPS} warm-up steps left out")
    layouts = [lay for lay in LAYOUTS if (lay.name in args.only if args.only
                                           else lay.strategy == "hybrid")]
    cost = step_cost()
    print(f"step cost: {cost.cores} cores, measured at {cost.load}", flush=True)
    for k in range(args.rounds):
        print(f"round {k + 1}: {load_now().text()}", flush=True)
        for lay in layouts if k % 2 == 0 else layouts[::-1]:
            got = per_step(labkit.run(**run_kwargs(lay, args.steps), timeout_s=600))
            comp, fixed, comm = work_parts(LAB_GPT, lay.layout(), cost, lay.strategy,
                                           lab_calls(lay))
            ms = 1e3
            print(f"{lay.name:24s} every rank's CPU a step {got['cpu'] * ms:6.1f} ms = compute "
                  f"spans {got['compute'] * ms:6.1f} + rest {(got['cpu'] - got['compute']) * ms:6.1f}"
                  f" | predicted compute + fixed {(comp + fixed) * ms:6.1f}, collectives "
                  f"{comm * ms:6.1f} | period {got['period'] * ms:6.1f} ms, CPU over "
                  f"{cost.cores} cores {got['cpu'] / cost.cores * ms:6.1f} ms", flush=True)
            print("    compute spans' CPU by op (all ranks, ms): " + ", ".join(
                f"{op} {v * ms:.1f}" for op, v in got["by_op"].items()))
            print("    collectives' wall by axis (all ranks, ms): " + ", ".join(
                f"{axis} {v * ms:.1f}" for axis, v in got["by_axis"].items()))


if __name__ == "__main__":
    main()
