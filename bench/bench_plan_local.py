"""The planner on this machine: predicted / measured step time of the lab's own layouts.

    python bench/bench_plan_local.py [--rounds 3] [--steps 8]

Issue 38, item 4. "This machine" as the planner's cluster (``labkit.lessons.plan_local``):
compute at ``labkit calibrate``'s fp32 matmul rate for each layout's GEMM shapes, shared by
its ranks, and the alpha-beta fitted to this machine's all-reduce; nothing fitted to a step.
A second column uses a one-rank run's own model FLOP rate instead (``one_rank_rate``):
the lesson GPT's step is mostly not matmuls, which a GEMM rate cannot see.
Each round runs every layout once (``labkit run hybrid`` over dp x pp x tp of 8 and 4 ranks,
2-rank DDP, ZeRO-1 and a 1F1B pipeline, the lesson GPT), the order reversed every other
round; each layout's number is the median over rounds of its median step. The load average
before each round is printed: on a busy machine the ratios say little (the target, within
25 %, is for 2 quiet cores).
"""

from __future__ import annotations

import argparse
import statistics

import labkit
from labkit.lessons.dedicated import machine_wire
from labkit.lessons.machine import load_now
from labkit.lessons.plan_local import LAYOUTS, one_rank_rate, predicted, this_machine


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args()
    for attempt in range(3):  # the fit comes back empty when a busy machine's times are noise
        try:
            wire = machine_wire(2)
            break
        except TypeError:
            print(f"the all-reduce fit failed (try {attempt + 1} of 3, {load_now().text()})")
    else:
        raise SystemExit("no alpha-beta fit of this machine's wire: run it on a quieter machine")
    print(f"wire (2-rank built-in all-reduce): alpha {wire.alpha_s * 1e6:.0f} us, "
          f"{wire.bandwidth_Bps / 1e9:.2f} GB/s")
    nets = {lay.name: this_machine(lay, wire) for lay in LAYOUTS}
    one = one_rank_rate(args.steps)
    print(f"one-rank run of the lesson GPT: {one * 0.7 / 1e9:.2f} GFLOP/s of model FLOPs "
          f"(as the planner's peak x MAMF: {one / 1e9:.2f})")
    ones = {lay.name: this_machine(lay, wire, rate=one) for lay in LAYOUTS}
    measured: dict[str, list[float]] = {lay.name: [] for lay in LAYOUTS}
    for k in range(args.rounds):
        print(f"round {k + 1}: {load_now().text()}", flush=True)
        for lay in LAYOUTS if k % 2 == 0 else LAYOUTS[::-1]:
            r = labkit.run(**lay.run_kwargs(args.steps), timeout_s=600)
            measured[lay.name].append(r.step_time_s)
    print(f"{'layout':24s} {'measured':>9s} | calibrate's GEMM rate: {'rate/rank':>9s} "
          f"{'predicted':>9s} {'ratio':>5s} | one-rank run: {'predicted':>9s} {'ratio':>5s}  "
          f"largest term")
    for lay in LAYOUTS:
        meas = statistics.median(measured[lay.name])
        q, q1 = predicted(lay, nets[lay.name]), predicted(lay, ones[lay.name])
        big = max(q1.time, key=lambda t: t.value)
        print(f"{lay.name:24s} {meas * 1e3:6.1f} ms | {nets[lay.name].gpu.fp32_flops / 1e9:19.2f} GF "
              f"{q.step_s * 1e3:6.1f} ms {q.step_s / meas:5.2f} | {q1.step_s * 1e3:20.1f} ms "
              f"{q1.step_s / meas:5.2f}  {big.name} {big.value / q1.step_s:.0%}")
    print(f"after: {load_now().text()}")


if __name__ == "__main__":
    main()
