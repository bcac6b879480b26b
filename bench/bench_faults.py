"""Fault reporting: inject raise / exit / kill / hang N times each and check that the caller
gets the right rank and kind in time, with ``err.timeline`` holding every step the failed
rank finished, and that no rank process survives 10 s later.

Bars (issue 2): report within max(5 s, 2 x median step) of the fault (hang: timeout + 5 s);
zero survivors. Also starts 20 runs at once on this host and counts address-in-use errors.

    python bench/bench_faults.py [--reps 20] [--concurrent 20]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import time
from pathlib import Path

import labkit
from labkit.errors import RunFailed


def survivors(since_pids: set[int]) -> list[int]:
    me = os.getpid()
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) not in since_pids:
            try:
                cmd = (proc / "cmdline").read_bytes()
                stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if b"labkit._rank_main" in cmd and stat[0] != "Z" and int(stat[1]) in (me, 1):
                out.append(int(proc.name))
    return out


def one_fault(kind: str, timeout_s: float) -> dict:
    step = 3
    t0 = time.monotonic()
    try:
        labkit.run(strategy="ddp", world_size=2, steps=6, inject_fault=f"1:{step}:{kind}",
                   timeout_s=timeout_s, threads_per_rank=1)
        return {"ok": False, "why": "run did not fail"}
    except RunFailed as err:
        elapsed = time.monotonic() - t0
        expected = {"raise": "exception", "exit": "exit", "kill": "signal", "hang": "timeout"}
        # err.timeline must hold steps 0..step-1 of the failed rank, and nothing after
        done = err.timeline.finished_steps(1) if err.timeline is not None else None
        return {"ok": err.rank == 1 and err.kind == expected[kind], "rank": err.rank,
                "kind": err.kind, "elapsed_s": elapsed,
                "timeline_ok": done == list(range(step))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--concurrent", type=int, default=20)
    p.add_argument("--hang-timeout", type=float, default=6.0)
    args = p.parse_args()
    before = set(int(x.name) for x in Path("/proc").iterdir() if x.name.isdigit())
    # Baseline: a clean run's wall time (start-up) and median step time.
    base = labkit.run(strategy="ddp", world_size=2, steps=6, threads_per_rank=1)
    report: dict = {"baseline_wall_s": round(base.wall_s, 3),
                    "median_step_s": round(base.step_time_s, 5), "faults": {}}
    for kind in ("raise", "exit", "kill", "hang"):
        rows = [one_fault(kind, args.hang_timeout) for _ in range(args.reps)]
        # time to report = elapsed minus the start-up and steps before the fault
        lat = [r["elapsed_s"] - base.wall_s * 0.9 for r in rows if "elapsed_s" in r]
        report["faults"][kind] = {
            "correct": sum(r["ok"] for r in rows), "reps": len(rows),
            "timeline_up_to_the_fault": sum(r.get("timeline_ok", False) for r in rows),
            "median_elapsed_s": round(statistics.median(r["elapsed_s"] for r in rows), 3),
            "max_elapsed_s": round(max(r["elapsed_s"] for r in rows), 3),
            "max_report_latency_s_est": round(max(lat), 3)}
    time.sleep(10)
    report["survivors_10s_later"] = len(survivors(before))

    def concurrent_run(i: int) -> str:
        try:
            labkit.run(strategy="ddp", world_size=2, steps=2, seed=i, timeout_s=300,
                       threads_per_rank=1)
            return "ok"
        except RunFailed as err:
            return "addr" if "address already in use" in str(err).lower() else err.kind

    with concurrent.futures.ThreadPoolExecutor(args.concurrent) as pool:
        outcomes = list(pool.map(concurrent_run, range(args.concurrent)))
    report["concurrent_runs"] = {"started": args.concurrent, "ok": outcomes.count("ok"),
                                 "address_in_use": outcomes.count("addr"),
                                 "other_failures": [o for o in outcomes if o not in ("ok",
                                                                                     "addr")]}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
