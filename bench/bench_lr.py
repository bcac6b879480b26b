"""Lesson 02's LR experiment, printed: final loss at equal samples, per LR policy.

Expected ordering (the issue's bar): "linear + warmup" and "linear scaling" land near the
single-rank loss; "LR unscaled" lags; the too-large LR diverges and clipping keeps it finite.
Usage: python bench/bench_lr.py [--world-size 4] [--samples 2560] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import math
import time

from labkit.lessons.scaling import lr_experiment


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--samples", type=int, default=2560)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = p.parse_args()
    ok_all = True
    for seed in args.seeds:
        t0 = time.monotonic()
        exp = lr_experiment(world_size=args.world_size, samples=args.samples, seed=seed)
        print(f"\nseed {seed} ({time.monotonic() - t0:.1f} s wall)\n{exp.text()}")
        final = {k.split(", ", 1)[-1]: r.final_loss() for k, r in exp.runs.items()}
        one, unscaled = final["1 rank"], final["LR unscaled"]
        warm = final["linear + warmup"]
        too = next(r for k, r in exp.runs.items() if "too large" in k)
        clip = next(r for k, r in exp.runs.items() if "clipping" in k)
        checks = {"unscaled lags 1 rank": unscaled > one,
                  "scaled+warmup within 0.2 of 1 rank": warm < one + 0.2,
                  "scaled+warmup beats unscaled": warm < unscaled,
                  "too large diverges": too.diverged,
                  "clipping stays finite": all(math.isfinite(v) for v in clip.losses)}
        for name, ok in checks.items():
            print(f"  {'OK ' if ok else 'BAD'} {name}")
        print(f"  ratio final loss unscaled / scaled+warmup = {unscaled / warm:.2f}")
        ok_all &= all(checks.values())
    return 0 if ok_all else 1


if __name__ == "__main__":
    raise SystemExit(main())
