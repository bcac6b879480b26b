"""The planner on this machine: predicted / measured step time of the lab's own layouts.

    python bench/bench_plan_local.py [--rounds 3] [--steps 8] [--cost-rounds 1] [--cached]

Issue 38, item 4. "This machine" as the planner's cluster (``labkit.theory.plan_local``):
first this machine's step cost is measured (``labkit.lessons.plan_local.step_cost``: one
rank, one core, the lesson GPT at 6 sizes, fitted to ``step_s + layer_s L + F / rate``; and
the 2-rank all-reduce's alpha-beta), unless ``--cached``. Then each round runs every layout
once (``labkit run hybrid`` over dp x pp x tp of 8 and 4 ranks, 2-rank DDP, ZeRO-1 and a
1F1B pipeline), the order reversed every other round; each layout's number is the median
over rounds of its median step. Nothing is fitted to a layout's step. Two comparisons: the
wall-clock step (the target, within 25 %, is for 2 quiet cores) and the CPU seconds of the
busiest rank's step (``step_cpu_s``) beside the planner's compute and fixed terms, which a
busy machine inflates less; and ``shared``, the shared-core rule applied to the measured
CPU (ranks x CPU / cores over the wall step), which says how much of a step on shared cores
the rule explains once a rank's CPU is known. The load average before each round is printed.
"""

from __future__ import annotations

import argparse
import statistics

import labkit
from labkit.lessons.machine import load_now
from labkit.lessons.plan_local import run_kwargs, step_cost
from labkit.theory.plan_lab import LAYOUTS, predict_lab
from labkit.theory.plan_local import cores_here


def shared(ranks: int, cpu_s: float, wall_s: float) -> float:
    """The shared-core rule on the measured CPU: ``ranks x cpu / cores`` over the measured
    wall step (the busiest rank's CPU for every rank: an upper bound); 0 with a core each."""
    cores = cores_here()
    return ranks * cpu_s / cores / wall_s if ranks > cores else 0.0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--cost-rounds", type=int, default=1, help="runs of each size for the fit")
    p.add_argument("--cached", action="store_true", help="use the cached step cost")
    args = p.parse_args()
    print(f"before: {load_now().text()}", flush=True)
    cost = step_cost(refresh=not args.cached, rounds=args.cost_rounds)
    print(f"step cost (one rank, one core): {cost.step_s * 1e3:.2f} ms a step + "
          f"{cost.layer_s * 1e3:.3f} ms a layer + FLOPs / {cost.flops_per_s / 1e9:.2f} GFLOP/s; "
          f"worst fit residual {cost.worst_residual:.1%}; wire alpha {cost.alpha_s * 1e6:.0f} us, "
          f"{cost.bandwidth_Bps / 1e9:.2f} GB/s; {cost.cores} cores ({cost.load})")
    for s in cost.samples:
        print(f"  L={s.layers} batch={s.batch}: {s.seconds * 1e3:.2f} ms")
    measured: dict[str, list[float]] = {lay.name: [] for lay in LAYOUTS}
    cpu: dict[str, list[float]] = {lay.name: [] for lay in LAYOUTS}
    for k in range(args.rounds):
        print(f"round {k + 1}: {load_now().text()}", flush=True)
        for lay in LAYOUTS if k % 2 == 0 else LAYOUTS[::-1]:
            r = labkit.run(**run_kwargs(lay, args.steps), timeout_s=600)
            measured[lay.name].append(r.step_time_s)
            cpu[lay.name].append(float(r.metrics.get("step_cpu_s", 0.0)))
    print(f"{'layout':24s} {'ranks':>5s} | wall: {'measured':>9s} {'predicted':>9s} {'ratio':>5s} "
          f"| CPU of a rank: {'measured':>9s} {'predicted':>9s} {'ratio':>5s} "
          f"| {'shared':>6s} | terms (ms)")
    for lay in LAYOUTS:
        meas, used = statistics.median(measured[lay.name]), statistics.median(cpu[lay.name])
        q = predict_lab(lay, cost)
        busy = sum(t.value for t in q.time if t.name in ("compute", "recompute", "fixed"))
        terms = ", ".join(f"{t.name} {t.value * 1e3:.1f}" for t in q.time if t.value > 0)
        print(f"{lay.name:24s} {lay.ranks:5d} | {meas * 1e3:12.1f} ms {q.step_s * 1e3:6.1f} ms "
              f"{q.step_s / meas:5.2f} | {used * 1e3:21.1f} ms {busy * 1e3:6.1f} ms "
              f"{busy / used:5.2f} | {shared(lay.ranks, used, meas):6.2f} | {terms}")
    print(f"after: {load_now().text()}")


if __name__ == "__main__":
    main()
