"""MFU a student can trust (issue 25, item 1): calibrate under load, then a quiet GPT run.

1. ``labkit calibrate`` beside two CPU-bound processes (it should refuse, naming the load);
2. the hogs stop; ``labkit run ddp --model gpt --world-size 2 --json`` reports ``mfu`` and the
   peak it used (``peak_flops_per_s``, ``peak_source``, ``peak_age_s``);
3. ``torch.mm`` with the threads the run used, at 512 ... 4096 in a fresh process: its best
   size is the reference.

Goal: 0 < mfu <= 1 and the run's peak >= 0.8 x torch.mm's best. A private cache
(``LABKIT_CACHE``) so nothing measured before counts. Look at ``uptime`` first: step 2 and
3 need a quiet machine. Usage: ``python bench/bench_mfu.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MM = """
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
best = {}
for n in (512, 1024, 1536, 2048, 3072, 4096):
    a, b = torch.randn(n, n), torch.randn(n, n)
    rates = []
    for _ in range(3):
        t0 = time.perf_counter(); a @ b; rates.append(2 * n**3 / (time.perf_counter() - t0))
    best[n] = max(rates)
print(json.dumps(best))
"""
HOG = "while True:\n    pass\n"
GOAL = 0.8


def labkit(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "labkit", *args], capture_output=True,
                          text=True, env=env, check=False)


def main() -> None:
    import argparse

    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    env = dict(os.environ, LABKIT_CACHE=tempfile.mkdtemp(prefix="bench-mfu-"),
               PYTHONPATH=str(ROOT))
    print(f"load before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(2)]
    try:
        time.sleep(1.0)
        cal = labkit("calibrate", env=env)
        print(f"1. calibrate beside 2 hogs: exit {cal.returncode}: "
              f"{(cal.stderr or cal.stdout).strip()[:300]}")
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    time.sleep(5.0)
    print(f"load after the hogs: {os.getloadavg()[0]:.2f}")
    run = labkit("run", "ddp", "--model", "gpt", "--world-size", "2", "--json", env=env)
    m = json.loads(run.stdout)["metrics"]
    peak = m.get("peak_flops_per_s", 0.0)
    print(f"2. GPT run: mfu {m.get('mfu')}, model {m['model_flops_per_s'] / 1e9:.1f} GFLOP/s, "
          f"peak {peak / 1e9:.1f} GFLOP/s ({m.get('peak_source')}, shape {m.get('peak_shape')}, "
          f"{m.get('peak_threads')} threads x {m.get('peak_processes', 1)} ranks, age "
          f"{m.get('peak_age_s', 0):.0f} s)")
    threads = m.get("peak_threads") or 2
    ranks = m.get("peak_processes") or 1
    mm = json.loads(subprocess.run([sys.executable, "-c", MM, str(threads)], capture_output=True,
                                   text=True, check=True).stdout)
    size, best = max(mm.items(), key=lambda kv: kv[1])
    print(f"3. torch.mm, {threads} threads: " + ", ".join(
        f"{n}: {r / 1e9:.0f}" for n, r in mm.items()) + f" GFLOP/s; best {best / 1e9:.1f} at {size}")
    mfu = m.get("mfu")
    ok = mfu is not None and 0 < mfu <= 1 and peak >= GOAL * best * ranks
    print(f"peak / (torch.mm best x {ranks} ranks) = {peak / best / ranks:.2f} (goal >= {GOAL}); "
          f"mfu in (0, 1]: "
          f"{mfu is not None and 0 < mfu <= 1} -> {'PASS' if ok else 'FAIL'}")


if __name__ == "__main__":
    main()
