"""Pipeline bubbles and stage balance, measured on real gloo ranks (lesson 03 bars).

Prints three tables from one run of this script:

1. P=2, M in {2, 4, 8} (GPipe and 1F1B): measured bubble fraction vs (p-1)/(m+p-1), both as a
   share of total step time (bar: within 0.05 when stages are balanced).
2. Interleaved (v=2) bubble / 1F1B bubble at P=2, M=4 (bar: in [0.4, 0.65] where cores allow;
   the prediction is (p-1)/(2m+p-1) / ((p-1)/(m+p-1)) = 5/9 = 0.56 at p=2, m=4).
2b. Zero bubble vs 1F1B at P=2, M=4: the bubble, the step time, and what each kind of action
   costs (I and W should each cost about half of B).
3. Stage balance: an uneven model split by layer count vs by measured cost; the speedup of
   the balanced split in step time, beside the prediction from the stage costs.

Table 1 also splits each measured bubble: ``replayed`` is the plan re-timed with the durations
the actions really took and free messages (``bubble_breakdown``), so ``replayed - predicted``
is uneven compute and ``measured - replayed`` is what communication added.

Sizing: the formula assumes messages are free. Here a message costs a fixed ~0.3-1 ms (gloo
over loopback, on cores that are busy computing), so each microbatch needs tens of ms of
compute for that to vanish: width 1024, 16 layers, batch 1024 (128 rows per microbatch at
M=8). The notebook's small batch shows the opposite on purpose.

Usage: python bench/bench_pipeline.py [--width 1024] [--depth 16] [--batch-size 1024]
[--steps 6]. About 70 s. Needs >= 2 free cores; P=4 on 2 cores oversubscribes (ranks wait
for a core), so P=4 is not measured here.
"""

from __future__ import annotations

import argparse

from labkit.base.devices import cpu_count
from labkit.launchers.results import RunResult
from labkit.lessons.pipeline import balance_demo, bubble_breakdown, run_pipeline
from labkit.strategies.pipeline import pipeline_model
from labkit.strategies.pipeline.metrics import op_times_ms
from labkit.theory import pipeline_speedup


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=16)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=1024)
    args = ap.parse_args()
    model = pipeline_model(args.width, args.depth)
    kw = {"steps": args.steps, "batch_size": args.batch_size, "model": model}
    print(f"# cores: {cpu_count()}, width {args.width}, depth {args.depth}, batch "
          f"{args.batch_size}, {args.steps} steps (first skipped)\n")
    print("## 1. bubble fraction (share of total step time), P=2")
    print(f"{'schedule':<10} {'M':>3} {'predicted':>10} {'replayed':>9} {'measured':>9} "
          f"{'|diff|':>7} {'within 0.05':>11}")
    bubbles: dict[tuple[str, int], float] = {}
    runs: dict[tuple[str, int], RunResult] = {}
    for schedule in ("gpipe", "1f1b"):
        for m in (2, 4, 8):
            runs[(schedule, m)] = run_pipeline(schedule, 2, m, **kw)
            split = bubble_breakdown(runs[(schedule, m)])
            pred, meas = split["predicted"], split["measured"]
            bubbles[(schedule, m)] = meas
            print(f"{schedule:<10} {m:>3} {pred:>10.3f} {split['replayed']:>9.3f} {meas:>9.3f} "
                  f"{abs(meas - pred):>7.3f} {'yes' if abs(meas - pred) <= 0.05 else 'NO':>11}")
    print("\n## 2. interleaved (v=2) vs 1F1B, P=2, M=4")
    inter_run = run_pipeline("interleaved", 2, 4, virtual=2, **kw)
    inter, split = inter_run.metrics, bubble_breakdown(inter_run)
    ratio = inter["bubble_fraction"] / max(bubbles[("1f1b", 4)], 1e-9)
    pred_ratio = inter["bubble_fraction_predicted"] / (1 / 5)
    print(f"interleaved bubble {inter['bubble_fraction']:.3f} (predicted "
          f"{inter['bubble_fraction_predicted']:.3f}, replayed {split['replayed']:.3f}); "
          f"1f1b bubble {bubbles[('1f1b', 4)]:.3f}")
    print(f"ratio interleaved/1f1b measured {ratio:.2f}, predicted {pred_ratio:.2f}, "
          f"bar [0.40, 0.65]: {'yes' if 0.4 <= ratio <= 0.65 else 'NO'}")
    print("\n## 2b. zero bubble (backward split into I and W) vs 1F1B, P=2, M=4")
    one_f, zb = runs[("1f1b", 4)], run_pipeline("zb", 2, 4, **kw)
    for label, res in (("1f1b", one_f), ("zb", zb)):
        times = op_times_ms(res.timeline.events)
        print(f"{label:<5} bubble {res.metrics['bubble_fraction']:.3f} (predicted "
              f"{res.metrics['bubble_fraction_predicted']:.3f})  pipeline "
              f"{res.metrics['pipeline_ms']:.0f} ms per step  ms per action "
              f"{ {k: round(v, 1) for k, v in times.items()} }")
    # same busy time (F + B = F + I + W), so the windows scale as 1 / (1 - bubble)
    predicted = (1 - zb.metrics["bubble_fraction_predicted"]) / (
        1 - one_f.metrics["bubble_fraction_predicted"])
    measured = one_f.metrics["pipeline_ms"] / zb.metrics["pipeline_ms"]
    print(f"pipeline time 1f1b / zb: measured x{measured:.2f}, predicted x{predicted:.2f} "
          f"(F=1, B=2, I=W=1)")
    print("\n## 3. stage balance: layer costs 1,1,1,1,1,1,4,4 on P=2, 1F1B, M=8")
    costs = (1, 1, 1, 1, 1, 1, 4, 4)
    runs = balance_demo(costs, 2, 8, steps=args.steps, batch_size=args.batch_size,
                        model=pipeline_model(args.width, len(costs)))
    for label, res in runs.items():
        stage_ms = res.metrics["stage_time_ms"]
        print(f"{label:<17} bounds {res.metrics['stage_bounds']}  stage ms/microbatch "
              f"{[round(t, 2) for t in stage_ms]}  step {res.step_time_s * 1e3:.1f} ms  "
              f"predicted speedup over 1 device x{pipeline_speedup(stage_ms, 8):.2f}")
    count, cost = runs["by layer count"], runs["by measured cost"]
    predicted = (pipeline_speedup(cost.metrics["stage_time_ms"], 8)
                 / pipeline_speedup(count.metrics["stage_time_ms"], 8))
    print(f"balancing speedup: measured x{count.step_time_s / cost.step_time_s:.2f} in step "
          f"time, x{count.metrics['pipeline_ms'] / cost.metrics['pipeline_ms']:.2f} in pipeline "
          f"window (what the prediction models), predicted x{predicted:.2f}")


if __name__ == "__main__":
    main()
