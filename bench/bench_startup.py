"""Start-up cost: ``labkit run ddp`` vs the same training under ``torchrun``.

Both commands train ddp on 2 ranks for 20 steps on this host and are timed as whole
subprocesses (wall clock from exec to exit: interpreter and torch imports, rendezvous,
training, teardown). ``labkit run`` starts its ranks directly and meets through a file
store; ``torchrun`` adds its elastic agent and a TCP rendezvous. The two are alternated
(so a noisy neighbour hits both alike) and the medians compared; both runs must end with
the same final-parameter hash, or the comparison is meaningless.

Goal: labkit / torchrun <= 0.6.  Usage: ``python bench/bench_startup.py [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["ddp", "--steps", "20", "--json", "--threads-per-rank", "1"]
LABKIT = [sys.executable, "-m", "labkit", "run", *COMMON, "--world-size", "2", "--no-progress"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            "2", "-m", "labkit.worker", "run", *COMMON]
GOAL = 0.6


def timed(cmd: list[str]) -> tuple[float, str]:
    """Wall seconds of one subprocess and the params hash it printed."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                       check=False)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("{"))
    return wall, json.loads(line)["params_sha256"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="alternating pairs of runs")
    rounds = ap.parse_args().rounds
    walls: dict[str, list[float]] = {"labkit run": [], "torchrun": []}
    hashes = set()
    timed(LABKIT)  # warm the page cache (torch's shared libraries) for both
    for i in range(rounds):
        order = [("labkit run", LABKIT), ("torchrun", TORCHRUN)]
        for name, cmd in order if i % 2 == 0 else order[::-1]:
            wall, sha = timed(cmd)
            walls[name].append(wall)
            hashes.add(sha)
    if len(hashes) != 1:
        sys.exit(f"the two launchers trained different parameters: {sorted(hashes)}")
    med = {k: statistics.median(v) for k, v in walls.items()}
    ratio = med["labkit run"] / med["torchrun"]
    print(f"ddp, 2 ranks, 20 steps, {rounds} alternating rounds, {os.cpu_count()} CPUs")
    for name, values in walls.items():
        print(f"  {name:<11} median {med[name]:.2f} s   runs: "
              + ", ".join(f"{v:.2f}" for v in values))
    verdict = "meets" if ratio <= GOAL else "misses"
    print(f"  ratio labkit run / torchrun = {ratio:.2f}  ({verdict} the goal <= {GOAL})")


if __name__ == "__main__":
    main()
