"""Ray in numbers: by value vs by reference through the object store, and what launching
labkit's ranks through Ray Train costs compared with labkit's own supervisor.

1. By value vs by reference (``labkit.lessons.ray_tasks.by_value_vs_by_reference``): the same
   payload handed to the same number of tasks, serialized once per task or ``ray.put`` once;
   median of ``--repeats`` alternating measurements, for each payload size and task count.
2. Start-up, cold: ``labkit run ddp --world-size 2 --steps 20 --json`` with and without
   ``--launcher ray``, as whole subprocesses (the Ray one starts and stops its own Ray),
   alternated ``--rounds`` times; both must print the same ``params_sha256``, and no Ray
   process may be left afterwards.
3. Start-up, warm: the same two runs from one process where Ray is already up (what a
   notebook pays after its first Ray cell).

Usage: ``python bench/bench_ray.py [--rounds 3] [--repeats 3]``.
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
CLI = [sys.executable, "-m", "labkit", "run", "ddp", "--world-size", "2", "--steps", "20",
       "--json", "--no-progress"]
SIZES = ((20.0, 16), (100.0, 16), (20.0, 64))
"""(payload MB, tasks) pairs for part 1."""


def timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("{"))
    return wall, json.loads(line)["params_sha256"]


def object_store(repeats: int) -> None:
    from labkit.lessons.ray_tasks import by_value_vs_by_reference

    print("1. by value vs by reference (median of alternating repeats)")
    for mb, tasks in SIZES:
        r = by_value_vs_by_reference(payload_mb=mb, tasks=tasks, repeats=repeats)
        print(f"  {mb:5.0f} MB x {tasks:3d} tasks: by value {r['by_value_s']*1e3:8.1f} ms, "
              f"by reference {r['by_reference_s']*1e3:7.1f} ms, speed-up {r['speedup']:5.1f}x "
              f"({r['mb_serialized_by_value']:.0f} vs {r['mb_serialized_by_reference']:.0f} MB "
              f"serialized)", flush=True)


def cold_start(rounds: int) -> None:
    from labkit.launchers.ray import ray_processes

    before = {pid for pid, _ in ray_processes()}
    walls: dict[str, list[float]] = {"labkit": [], "ray": []}
    hashes = set()
    for i in range(rounds):
        order = [("labkit", CLI), ("ray", [*CLI, "--launcher", "ray"])]
        for name, cmd in order if i % 2 == 0 else order[::-1]:
            wall, sha = timed(cmd)
            walls[name].append(wall)
            hashes.add(sha)
    left = [p for p in ray_processes() if p[0] not in before]
    print("2. start-up, cold (whole `labkit run ddp` subprocesses, 2 ranks, 20 steps)")
    for name, v in walls.items():
        print(f"  --launcher {name:<6} median {statistics.median(v):6.2f} s   runs: "
              + ", ".join(f"{x:.2f}" for x in v))
    print(f"  same params_sha256: {len(hashes) == 1}   Ray processes left: {len(left)}",
          flush=True)
    if len(hashes) != 1 or left:
        sys.exit(f"hashes {sorted(hashes)}, left over {left}")


def warm_start(rounds: int) -> None:
    import labkit
    from labkit.launchers.ray import ensure_ray, shutdown_ray

    t0 = time.perf_counter()
    ensure_ray()
    init_s = time.perf_counter() - t0
    walls: dict[str, list[float]] = {"labkit": [], "ray": []}
    for _ in range(rounds):
        for name in walls:
            t0 = time.perf_counter()
            labkit.run(strategy="ddp", world_size=2, steps=20, progress=False, launcher=name)
            walls[name].append(time.perf_counter() - t0)
    shutdown_ray()
    print(f"3. start-up, warm (one process, Ray already up; starting it took {init_s:.2f} s)")
    for name, v in walls.items():
        print(f"  launcher={name:<7} median {statistics.median(v):6.2f} s   runs: "
              + ", ".join(f"{x:.2f}" for x in v))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(f"{os.cpu_count()} CPUs")
    from labkit.launchers.ray import ensure_ray, shutdown_ray

    ensure_ray()
    object_store(args.repeats)
    shutdown_ray()
    cold_start(args.rounds)
    warm_start(args.rounds)


if __name__ == "__main__":
    main()
