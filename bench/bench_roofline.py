"""Lesson 01's roofline verdicts, quiet or not: the all-reduce / compute ratios per repeat.

    python bench/bench_roofline.py [--sweeps 2] [--calls 1 5] [--widths 256 512]

Runs ``labkit.lessons.dp_roofline.roofline_sweep`` on a warm 2-rank pool for every (width,
calls) variant, alternated ``--sweeps`` times, and prints per sweep: the least compute and
all-reduce per batch (ms), the all-reduce / compute ratio of every repeat at the smallest
batch, the crossover, and the three verdict words with their numbers. The lesson uses the
last width and call count (``dp_roofline.CALLS``); a ratio that crosses 1 between repeats at
the smallest batch is what flips its "below the crossover" verdict.
"""

from __future__ import annotations

import argparse
import itertools
import os

import labkit
from labkit.lessons.dp_roofline import BATCHES, roofline_sweep, roofline_verdicts
from labkit.lessons.machine import load_now


def _ms(xs: list[float]) -> str:
    return " ".join(f"{x * 1e3:6.2f}" for x in xs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sweeps", type=int, default=2)
    p.add_argument("--calls", type=int, nargs="+", default=[1, 5])
    p.add_argument("--widths", type=int, nargs="+", default=[256, 512])
    args = p.parse_args()
    print(f"# {os.cpu_count()} cores; {load_now().text()}")
    with labkit.pool(2) as pool:
        for s, (width, calls) in itertools.product(range(args.sweeps),
                                                   itertools.product(args.widths, args.calls)):
            r = roofline_sweep(pool, width=width, calls=calls)
            ratios = [a[0] / c[0] for a, c in zip(r.allreduce, r.compute)]
            print(f"sweep {s + 1} width {width} ({r.params / 1e6:.1f} M), {calls} call(s): "
                  f"compute {_ms(r.least('compute'))} | all-reduce {_ms(r.least('allreduce'))} ms")
            print(f"  ratio at batch {BATCHES[0]} per repeat "
                  f"{' '.join(f'{x:.2f}' for x in ratios)}; crossover {r.crossover():.0f}")
            for v in roofline_verdicts(r):
                print(f"  {v.word:12s} {v.what}: {v.sample.value:.2f} +- {v.sample.noise:.2f}")
    print(f"# {load_now(fresh=True).text()}")


if __name__ == "__main__":
    main()
