"""Rank start-up: ranks forked from the warm fork server vs ranks exec'd afresh.

In one Python process (as in a notebook kernel), the same runs are timed with ranks forked
by ``labkit.launchers.forkserver`` (the default) and with ``LABKIT_FORKSERVER=0`` (every rank a new
interpreter that imports torch, and ``torch._dynamo`` as soon as it builds an optimizer or
a DDP). The two are alternated round by round so a noisy neighbour hits both alike, and
the medians compared; forked and exec'd runs must train the same parameters. Also shown:
what the first run in a process pays to start the server (once).

Goal: forked / exec'd <= 0.25 for `labkit.run ddp` on 2 ranks, 10 steps.
Usage: ``python bench/bench_rankstart.py [--rounds 5]``.
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
from labkit.launchers import forkserver

GOAL = 0.25


def _noop(ctx):
    return ctx.rank


CASES = {
    "launch(noop), 2 ranks": lambda: labkit.launch(_noop, 2),
    "launch(noop), 4 ranks": lambda: labkit.launch(_noop, 4),
    "run ddp, 2 ranks, 10 steps": lambda: labkit.run(strategy="ddp", world_size=2, steps=10,
                                                     progress=False),
    "run zero-2, 4 ranks, 10 steps": lambda: labkit.run(strategy="zero", world_size=4,
                                                        steps=10, progress=False,
                                                        options={"stage": 2}),
}


def timed(case: str, forked: bool) -> tuple[float, str | None]:
    os.environ[forkserver.SWITCH_ENV] = "1" if forked else "0"
    t0 = time.perf_counter()
    result = CASES[case]()
    return time.perf_counter() - t0, getattr(result, "params_sha256", None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="alternating pairs of runs per case")
    rounds = ap.parse_args().rounds
    import warnings

    warnings.simplefilter("ignore")  # 4 ranks on 2 cores: the oversubscription warning
    t0 = time.perf_counter()
    timed("launch(noop), 2 ranks", forked=True)
    first = time.perf_counter() - t0
    print(f"first run in this process (starts the server, imports torch once): {first:.2f} s")
    print(f"{'case':<32} {'exec (s)':>9} {'forked (s)':>10} {'ratio':>6}")
    ratios = {}
    for case in CASES:
        walls: dict[bool, list[float]] = {True: [], False: []}
        hashes: dict[bool, set[str | None]] = {True: set(), False: set()}
        for i in range(rounds):
            for forked in (True, False) if i % 2 == 0 else (False, True):
                wall, sha = timed(case, forked)
                walls[forked].append(wall)
                hashes[forked].add(sha)
        if hashes[True] != hashes[False]:
            sys.exit(f"{case}: forked and exec'd ranks trained different parameters")
        med = {k: statistics.median(v) for k, v in walls.items()}
        ratios[case] = med[True] / med[False]
        print(f"{case:<32} {med[False]:>9.2f} {med[True]:>10.2f} {ratios[case]:>6.3f}")
    goal_case = "run ddp, 2 ranks, 10 steps"
    verdict = "PASS" if ratios[goal_case] <= GOAL else "FAIL"
    print(f"{goal_case}: forked / exec'd = {ratios[goal_case]:.3f} (goal <= {GOAL}) {verdict}")
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
