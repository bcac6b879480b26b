"""3D parallelism on the GPT: tracing overhead, traffic per axis vs prediction, MFU per strategy.

    python bench/bench_3d.py [--rounds 4] [--steps 12]

1. Tracing overhead of hybrid runs: the same 2-rank hybrid runs (pp2, then tp2) alternately
   with the tracer on and off; each rank times its own steps with ``perf_counter`` either
   way (``step_wall_s``), so both sides are measured the same way. Bar: <= 3 %.
2. Traffic per axis, measured from the trace vs ``labkit.theory.parallel_layout``, for
   every factorisation of 4 and of 8 ranks (4 and 8 ranks share 2 cores: bytes only).
3. MFU of each strategy training the same GPT on 2 ranks (model FLOPs per second over this
   machine's measured peak matmul FLOP/s, ``labkit.analysis.calibrate``).
"""

from __future__ import annotations

import argparse
import statistics

import labkit
from labkit.analysis.calibrate import calibrate
from labkit.lessons.parallel3d import LESSON_GPT, factorisations

GPT = {"kind": "gpt", "width": 128, "depth": 4, "heads": 4, "seq_len": 64}


def _hybrid(pp: int, tp: int, steps: int, trace: bool) -> float:
    r = labkit.run(strategy="hybrid", model=GPT, steps=steps, batch_size=16, trace=trace,
                   progress=False, timeout_s=600,
                   options={"pp": pp, "tp": tp, "microbatches": 4 if pp > 1 else 1})
    return float(r.metrics["step_wall_s"])


def tracing_overhead(rounds: int, steps: int) -> None:
    print("1. tracing overhead, hybrid on the GPT (median step, slowest rank)")
    for pp, tp in ((2, 1), (1, 2)):
        on, off = [], []
        for k in range(rounds):  # alternate which goes first: no position bias
            for trace in ((True, False) if k % 2 == 0 else (False, True)):
                (on if trace else off).append(_hybrid(pp, tp, steps, trace))
        a, b = statistics.median(on), statistics.median(off)
        print(f"   pp{pp} x tp{tp}: traced {a * 1e3:.1f} ms, untraced {b * 1e3:.1f} ms, "
              f"overhead {100 * (a / b - 1):+.1f} %  (bar <= 3 %)")


def traffic_per_axis() -> None:
    print("2. traffic per axis, measured / predicted (wire bytes per step, all ranks)")
    for world in (4, 8):
        for dp, pp, tp in factorisations(world, LESSON_GPT):
            r = labkit.run(strategy="hybrid", model=LESSON_GPT, steps=2, batch_size=8,
                           progress=False, timeout_s=600,
                           options={"dp": dp, "pp": pp, "tp": tp, "microbatches": 2,
                                    "zero_stage": 1 if dp > 1 else 0})
            m = r.metrics
            cells = "  ".join(f"{a} {m['comm_bytes_per_axis'][a] / 1e6:7.3f}/"
                              f"{m['predicted_comm_bytes_per_axis'][a] / 1e6:7.3f} MB"
                              for a in ("dp", "pp", "tp"))
            worst = max(abs(v - 1) for v in m["comm_ratio_per_axis"].values())
            print(f"   dp{dp} pp{pp} tp{tp}: {cells}   worst |ratio-1| {worst:.4f}")


def mfu_per_strategy(steps: int) -> None:
    peak = calibrate("cpu")
    print(f"3. MFU on the GPT, 2 ranks (peak {peak['peak_flops_per_s'] / 1e9:.1f} GFLOP/s fp32 "
          f"matmul, {peak['threads']} threads)" if peak else "3. MFU (no calibration)")
    runs = [("ddp", {}), ("ddp-bucketed", {"bucket_cap_mb": 1.0}), ("zero", {"stage": 1}),
            ("zero", {"stage": 3}), ("tp", {}), ("pipeline", {"microbatches": 4}),
            ("hybrid", {"pp": 2, "microbatches": 4})]
    for name, opts in runs:
        r = labkit.run(strategy=name, model=GPT, world_size=2, steps=steps, progress=False,
                       options=opts or None, timeout_s=600)
        m = r.metrics
        label = name + ("" if not opts else " " + ",".join(f"{k}={v}" for k, v in opts.items()))
        print(f"   {label:28s} tokens/s {m['tokens_per_s']:8.0f}   MFU {m['mfu']:.3f}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=12)
    args = p.parse_args()
    tracing_overhead(args.rounds, args.steps)
    traffic_per_axis()
    mfu_per_strategy(args.steps)


if __name__ == "__main__":
    main()
