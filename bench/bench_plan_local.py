"""The planner on this machine: predicted / measured step time of the lab's own layouts.

    python bench/bench_plan_local.py [--rounds 3] [--steps 8] [--cost-rounds 1] [--cached]
                                     [--each-round] [--only NAME ...]

Issue 38, item 4. "This machine" as the planner's cluster (``labkit.theory.plan_machine``):
first this machine is measured (``labkit.lessons.plan_local.step_cost``: each engine's
one-rank step at a few sizes, fitted; the collectives' wall and CPU at 2, 4 and 8 ranks),
unless ``--cached``. Then each round runs every layout once (``labkit run hybrid`` over
dp x pp x tp of 8 and 4 ranks, 2-rank DDP, ZeRO-1 and a 1F1B pipeline; ``--only`` keeps
those named), the order reversed every other round; each layout's number is the median over
rounds of its median step. A step is measured as the time it adds to the run (from the
previous step's end to its own, each ending with its slowest rank: ``Timeline.step_periods_s``),
which is what the planner predicts (throughput divides by it); the span from the earliest
rank's start, longer by the ranks' skew in a pipeline, is printed beside it. Nothing is fitted
to a layout's step. With ``--each-round`` the machine is measured again at the start of every
round (nothing cached) and each round's layouts are predicted from that round's own
measurement: this machine's speed drifts 10-20 % between minutes, so a cost measured once
and runs minutes later disagree by that much whatever the model (docs/benchmarks.md); the
ratio of every round is printed, and the median of them. Printed per layout: the
wall step, measured and predicted (the target: within 25 % on 2 quiet cores); the CPU
seconds of the busiest rank's step (``step_cpu_s``) beside the prediction's (compute,
fixed work and its collectives' CPU); the collectives a rank issues per step, counted in
the trace beside the planner's count (a check of ``plan_lab.lab_calls``); every term
of the prediction; and every rank's CPU added up over the cores (a rank's mean, not the
busiest's), measured beside predicted: the least a step on shared cores can take; and where
that CPU went, every rank's added up: in compute spans (their thread CPU; a tensor-parallel
all-reduce runs inside the forward's span, so its calling thread's CPU counts there) and the
rest (collectives, their threads, the loop's glue), beside ``work_parts``' compute + fixed work
and collectives' CPU, with the share of the step the cores sat idle (the period above that CPU
over the cores, which the planner's work-law bound does not charge). The load average before
each round is printed.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from typing import Any

import labkit
from labkit.lessons.machine import load_now
from labkit.lessons.plan_local import measure, run_kwargs, step_cost
from labkit.theory.plan_lab import LAB_GPT, LAYOUTS, LabLayout, lab_calls, predict_lab
from labkit.theory.plan_local import StepCost
from labkit.theory.plan_machine import rank_cpu, work_parts

SKIP = {"wait", "barrier"}
"""Trace spans that are not a collective of their own (an async op's wait, a barrier)."""


def traced_calls(result: Any, ranks: int) -> float:
    """Collective spans per rank per step in ``result``'s trace (the first step skipped;
    a send and a receive count one each)."""
    steps = {e.step for e in result.timeline if e.step}
    spans = [e for e in result.timeline if e.step and e.lane.value == "comm"
             and e.op.value not in SKIP and e.name != "timing"]
    return len(spans) / ranks / max(1, len(steps))


def planned_calls(lay: LabLayout) -> float:
    """The planner's collectives per rank per step, counted as the trace counts them."""
    kinds = lab_calls(lay)
    return sum(k.ranks * c.calls * (2 if c.op == "exchange" else 1)
               for k in kinds for c in k.calls) / lay.ranks


def predicted_cpu(lay: LabLayout, cost: StepCost) -> float:
    """CPU seconds of the busiest rank's step: its compute and fixed work on the critical
    path, plus its collectives' CPU."""
    q = predict_lab(lay, cost)
    busy = sum(t.value for t in q.time if t.name in ("compute", "recompute", "fixed",
                                                     "microbatch"))
    return busy + max(rank_cpu(cost, lay.ranks, k) for k in lab_calls(lay))


def mean_rank_cpu(result: Any) -> float:
    """CPU seconds of a step, each rank's median over its steps (the first skipped), averaged
    over the ranks (``step_cpu_s`` is the slowest rank's, a max over ranks)."""
    per = [statistics.median(o.record.step_cpu_seconds[1:] or o.record.step_cpu_seconds)
           for o in result.outputs if o.record is not None and o.record.step_cpu_seconds]
    return statistics.fmean(per) if per else 0.0


def compute_span_cpu(result: Any) -> float:
    """CPU seconds of a step in compute spans, every rank's added up (each rank's median over
    its steps, the first skipped, as ``mean_rank_cpu``)."""
    per: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for e in result.timeline:
        if e.step and e.lane.value == "compute":
            per[e.rank][e.step] += (e.cpu_ns if e.cpu_ns is not None else e.dur_ns) / 1e9
    return sum(statistics.median(steps.values()) for steps in per.values())


def predicted_work(lay: LabLayout, cost: StepCost) -> float:
    """Every rank's predicted CPU of a step, added up (``plan_machine.work_parts``)."""
    return sum(work_parts(LAB_GPT, lay.layout(), cost, lay.strategy, lab_calls(lay)))


def describe(cost: StepCost) -> list[str]:
    lines = [f"this machine: {cost.cores} cores ({cost.load})"]
    for e in cost.engines:
        lines.append(f"  engine {e.strategy:9s} step {e.step_s * 1e3:6.2f} ms + m x "
                     f"({e.microbatch_s * 1e3:5.2f} ms + {e.layer_s * 1e3:5.2f} ms x L) + "
                     f"F / {e.flops_per_s / 1e9:5.2f} GFLOP/s; worst residual "
                     f"{e.worst_residual:.0%}")
    for c in cost.comms:
        lines.append(f"  {c.op:10s} at {c.ranks} ranks: wall {c.wall_s * 1e6:6.0f} us + "
                     f"{c.wall_s_per_byte * 1e9:6.2f} ns/B, CPU {c.cpu_s * 1e6:6.0f} us + "
                     f"{c.cpu_s_per_byte * 1e9:6.2f} ns/B")
    return lines


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--cost-rounds", type=int, default=1, help="runs of each size for the fit")
    p.add_argument("--cached", action="store_true", help="use the cached step cost")
    p.add_argument("--each-round", action="store_true",
                   help="measure the machine again at each round's start; predict that round "
                        "from it")
    p.add_argument("--only", nargs="*", default=None, help="layout names to run (default all)")
    args = p.parse_args()
    layouts = [lay for lay in LAYOUTS if not args.only or lay.name in args.only]
    print(f"before: {load_now().text()}", flush=True)
    cost = step_cost(refresh=not args.cached, rounds=args.cost_rounds)
    print("\n".join(describe(cost)), flush=True)
    wall: dict[str, list[float]] = {lay.name: [] for lay in layouts}
    span: dict[str, list[float]] = {lay.name: [] for lay in layouts}
    cpu: dict[str, list[float]] = {lay.name: [] for lay in layouts}
    calls: dict[str, float] = {}
    mean_cpu: dict[str, list[float]] = {lay.name: [] for lay in layouts}
    ratios: dict[str, list[float]] = {lay.name: [] for lay in layouts}
    in_spans: dict[str, list[float]] = {lay.name: [] for lay in layouts}
    for k in range(args.rounds):
        print(f"round {k + 1}: {load_now().text()}", flush=True)
        if args.each_round and k > 0:
            cost = measure(rounds=args.cost_rounds)
            print(f"  measured again ({cost.load})", flush=True)
        for lay in layouts if k % 2 == 0 else layouts[::-1]:
            r = labkit.run(**run_kwargs(lay, args.steps), timeout_s=600)
            period = r.timeline.median_step_period_s()
            ratios[lay.name].append(predict_lab(lay, cost).step_s / period)
            wall[lay.name].append(period)
            in_spans[lay.name].append(compute_span_cpu(r))
            span[lay.name].append(r.step_time_s)
            cpu[lay.name].append(float(r.metrics.get("step_cpu_s", 0.0)))
            calls[lay.name] = traced_calls(r, lay.ranks)
            mean_cpu[lay.name].append(mean_rank_cpu(r))
    print(f"{'layout':24s} {'ranks':>5s} | wall: {'measured':>9s} {'predicted':>9s} {'ratio':>5s} "
          f"| CPU of the busiest rank: {'measured':>8s} {'predicted':>9s} {'ratio':>5s} "
          f"| collectives a rank a step: traced, planned")
    for lay in layouts:
        meas, used = statistics.median(wall[lay.name]), statistics.median(cpu[lay.name])
        q, busy = predict_lab(lay, cost), predicted_cpu(lay, cost)
        print(f"{lay.name:24s} {lay.ranks:5d} | {meas * 1e3:12.1f} ms {q.step_s * 1e3:6.1f} ms "
              f"{q.step_s / meas:5.2f} | {used * 1e3:31.1f} ms {busy * 1e3:6.1f} ms "
              f"{busy / used:5.2f} | {calls[lay.name]:6.1f} {planned_calls(lay):6.1f}")
        print("    terms (ms): " + ", ".join(f"{t.name} {t.value * 1e3:.1f}" for t in q.time
                                             if t.value > 0))
        print("    predicted / measured, each round from its own round's measurement of the "
              "machine: " if args.each_round else "    predicted / measured, each round: ",
              " ".join(f"{x:.2f}" for x in ratios[lay.name]),
              f"(median {statistics.median(ratios[lay.name]):.2f})")
        print(f"    a step's span, earliest rank's start to latest rank's end: "
              f"{statistics.median(span[lay.name]) * 1e3:.1f} ms (longer by the ranks' skew)")
        work = statistics.median(mean_cpu[lay.name]) * lay.ranks
        print(f"    every rank's CPU over {cost.cores} cores: measured {work / cost.cores * 1e3:.1f} "
              f"ms (a rank's mean {work / lay.ranks * 1e3:.1f} ms), predicted "
              f"{predicted_work(lay, cost) / cost.cores * 1e3:.1f} ms")
        spans = statistics.median(in_spans[lay.name])
        comp, fixed, comm = work_parts(LAB_GPT, lay.layout(), cost, lay.strategy, lab_calls(lay))
        print(f"    every rank's CPU a step: in compute spans {spans * 1e3:.1f} ms (predicted "
              f"compute + fixed {(comp + fixed) * 1e3:.1f}), the rest {(work - spans) * 1e3:.1f} "
              f"ms (predicted collectives' CPU {comm * 1e3:.1f}); the cores sat idle "
              f"{max(0.0, 1 - work / cost.cores / meas):.0%} of the step")
    print(f"after: {load_now().text()}")


if __name__ == "__main__":
    main()
