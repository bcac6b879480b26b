"""The dedicated-core replay against the measurement (issue 32, item 3).

    python bench/bench_replay.py [--rounds 3] [--hogs 0]

Fits the wire's alpha-beta on this machine (the built-in all-reduce, 4 KB to 4 MB), then runs
DDP (naive, bucketed, torch's), GPipe and 1F1B on 2 ranks and the parameter server's
straggler on 3, ``rounds`` times
alternated, and prints each run's median step measured and replayed
(``labkit.analysis.replay``) with their ratio, the messages timed once by the fitted wire and
once by the run's own typical messages (the lessons' default). On a quiet machine with ranks <= cores the
ratio should sit within 0.85-1.15 (the replay is earned, not assumed); ``--hogs 2`` starts two
CPU-bound processes beside the runs, and the replay should then stay near its quiet value
while the measurement grows.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics

import labkit
from labkit.analysis.replay import replay
from labkit.config import ModelConfig
from labkit.theory.comm import AlphaBeta

MLP = ModelConfig(width=512, depth=4)
CASES = {
    "ddp-naive": dict(strategy="ddp-naive", model=MLP),
    "ddp-bucketed": dict(strategy="ddp-bucketed", model=MLP, options={"bucket_cap_mb": 1.0}),
    "ddp": dict(strategy="ddp", model=MLP, options={"bucket_cap_mb": 1.0}),
    "gpipe": dict(strategy="pipeline", batch_size=512,
                  options={"schedule": "gpipe", "microbatches": 4}),
    "1f1b": dict(strategy="pipeline", batch_size=512,
                 options={"schedule": "1f1b", "microbatches": 4}),
    "ps straggler": dict(strategy="ps", world_size=3, options={"straggler": "2:3"}),
}
"""Two ranks each, but the parameter server's straggler (a server and two workers, the second
computing 3x slower): three ranks on two cores share them even on a quiet machine."""


def _hog() -> None:
    while True:
        pass


def wire() -> AlphaBeta:
    b = labkit.run(strategy="allreduce-bench", world_size=2, progress=False,
                   options={"impl": "builtin", "sizes": ["4KB", "256KB", "4MB"], "iters": 6})
    return AlphaBeta.from_bench(b.metrics["alpha_beta"], stalls=False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hogs", type=int, default=0)
    args = ap.parse_args()
    hogs = [mp.Process(target=_hog, daemon=True) for _ in range(args.hogs)]
    for h in hogs:
        h.start()
    try:
        fit = wire()
        print(f"wire: alpha {fit.alpha_s * 1e6:.0f} us, {fit.bandwidth_Bps / 1e9:.2f} GB/s; "
              f"load {os.getloadavg()[0]:.1f}, {args.hogs} hogs")
        got: dict[str, list[tuple[float, float]]] = {k: [] for k in CASES}
        for k in range(args.rounds):
            names = list(CASES) if k % 2 == 0 else list(reversed(CASES))
            for name in names:
                r = labkit.run(**{"world_size": 2, "steps": 6, "progress": False, **CASES[name]})
                got[name].append((r.timeline.median_step_s(), replay(r.timeline, fit).median_step_s(),
                                  replay(r.timeline).median_step_s()))
        print(f"{'run':13s} {'measured ms':>12s} {'fit wire: replayed ms, /measured':>34s}   "
              f"{'own messages: replayed ms, /measured':>38s}")
        for name, runs in got.items():
            m = statistics.median(p[0] for p in runs)
            cols = []
            for i in (1, 2):
                ratios = [p[i] / p[0] for p in runs]
                cols.append(f"{statistics.median(p[i] for p in runs) * 1e3:9.1f} "
                            f"{statistics.median(ratios):5.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
            print(f"{name:13s} {m * 1e3:12.1f} {cols[0]:>34s}   {cols[1]:>38s}")
    finally:
        for h in hogs:
            h.kill()


if __name__ == "__main__":
    main()
