"""Warm ranks: the first call of a run on a new ``labkit.Pool`` vs the same call again.

The first call starts the ranks (interpreter, torch imports, process group) and trains;
the second finds them warm and only trains. Each round makes a new pool, times both calls
(wall clock around ``pool.run``, in this process) and a fresh ``labkit.run`` of the same
config, whose final-parameter hash must equal both pool calls' (same seed, same bits).

Goal: second / first <= 0.2 on 2 cores.
Usage: ``python bench/bench_pool.py [--rounds 3] [--strategy ddp] [--steps N]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import labkit

GOAL = 0.2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="new pools (first + second call)")
    ap.add_argument("--strategy", default="ddp")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--steps", type=int, default=None, help="default: the strategy's")
    args = ap.parse_args()
    kw: dict[str, object] = {"strategy": args.strategy, "world_size": args.world_size,
                             "progress": False}
    if args.steps is not None:
        kw["steps"] = args.steps
    first, second, hashes = [], [], set()
    for _ in range(args.rounds):
        with labkit.Pool(args.world_size) as pool:
            t0 = time.perf_counter()
            a = pool.run(**kw)
            t1 = time.perf_counter()
            b = pool.run(**kw)
            t2 = time.perf_counter()
        first.append(t1 - t0)
        second.append(t2 - t1)
        hashes |= {a.params_sha256, b.params_sha256}
    t0 = time.perf_counter()
    fresh = labkit.run(**kw)
    fresh_s = time.perf_counter() - t0
    same = hashes == {fresh.params_sha256} and fresh.params_sha256 is not None
    med1, med2 = statistics.median(first), statistics.median(second)
    ratio = med2 / med1
    print(f"{args.strategy}, {args.world_size} ranks, {fresh.config.steps} steps, "
          f"{args.rounds} new pools, {os.cpu_count()} CPUs")
    print(f"  first call  (starts the ranks) median {med1:.2f} s   runs: "
          + ", ".join(f"{v:.2f}" for v in first))
    print(f"  second call (warm ranks)       median {med2:.3f} s  runs: "
          + ", ".join(f"{v:.3f}" for v in second))
    print(f"  fresh labkit.run                      {fresh_s:.2f} s")
    verdict = "meets" if ratio <= GOAL else "misses"
    print(f"  ratio second / first = {ratio:.3f}  ({verdict} the goal <= {GOAL})")
    print(f"  params_sha256 pool == fresh run: {same} ({fresh.params_sha256})")
    if not same:
        sys.exit(f"the pool and a fresh run trained different parameters: {sorted(hashes)}")


if __name__ == "__main__":
    main()
