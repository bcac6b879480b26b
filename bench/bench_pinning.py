"""Does pinning ranks to cores make step times steadier? (issue 32, item 1)

    python bench/bench_pinning.py [--rounds 6] [--steps 12]

Runs 2-rank bucketed DDP and 2-rank 1F1B, each pinned (``labkit.rank.pinning``: rank r on the
r-th usable core) and unpinned (``LABKIT_PIN_RANKS=0``), alternated pinned / unpinned /
unpinned / pinned ... for ``rounds`` rounds, and prints for each variant

* the median step (ms): the median over runs of each run's median step,
* the spread within a run: the median over runs of (p90 - p10) / median of its step times,
* the spread over runs: (max - min) / median of the runs' median steps.

Only the ratios measured in this one run mean anything; a quiet machine (``/work/bin/quiet``
on the shared one) is the one where the scheduler, not other programs, moves the ranks.
"""

from __future__ import annotations

import argparse
import os
import statistics

import labkit
from labkit.config import ModelConfig
from labkit.rank.pinning import PIN_ENV

CASES = {
    "ddp-bucketed": dict(strategy="ddp-bucketed", model=ModelConfig(width=512, depth=4),
                         options={"bucket_cap_mb": 1.0}),
    "1f1b": dict(strategy="pipeline", batch_size=512,
                 options={"schedule": "1f1b", "microbatches": 4}),
}


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def one_run(case: dict[str, object], pinned: bool, steps: int) -> tuple[float, float, bool]:
    """(median step s, (p90 - p10) / median within the run, whether its ranks were pinned)."""
    os.environ[PIN_ENV] = "1" if pinned else "0"
    r = labkit.run(**{"world_size": 2, "steps": steps, "progress": False, **case})
    times = r.timeline.step_times_s()[1:]  # the first step pays for warm-up
    med = statistics.median(times)
    return med, (_quantile(times, 0.9) - _quantile(times, 0.1)) / med, \
        bool(r.timeline.meta["pinning"]["pinned"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()
    print(f"usable cores {len(os.sched_getaffinity(0))}, load {os.getloadavg()[0]:.1f}")
    try:
        for name, case in CASES.items():
            got: dict[bool, list[tuple[float, float, bool]]] = {True: [], False: []}
            for k in range(args.rounds):
                order = (True, False) if k % 2 == 0 else (False, True)
                for pinned in order:
                    got[pinned].append(one_run(case, pinned, args.steps))
            for pinned in (True, False):
                runs = got[pinned]
                meds = [m for m, _, _ in runs]
                mid = statistics.median(meds)
                assert all(p == pinned for _, _, p in runs), "the meta disagrees with the switch"
                print(f"{name:13s} {'pinned' if pinned else 'unpinned':9s} median step "
                      f"{mid * 1e3:7.2f} ms; within a run (p90-p10)/median "
                      f"{statistics.median(w for _, w, _ in runs):.3f}; over runs "
                      f"(max-min)/median {(max(meds) - min(meds)) / mid:.3f} ({len(runs)} runs)")
    finally:
        os.environ.pop(PIN_ENV, None)


if __name__ == "__main__":
    main()
