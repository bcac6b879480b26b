"""Fault reporting: inject raise / exit / kill / hang N times each and check that the caller
gets the right rank and kind in time, with ``err.timeline`` holding every step the failed
rank finished, and that no rank process survives 10 s later.

Bars (issue 2): report within max(5 s, 2 x median step) of the fault (hang: timeout + 5 s);
zero survivors. Also starts 20 runs at once on this host and counts address-in-use errors.

What students were seen to do (issue 14, ``--kinds silent fork interrupt corrupt``):
silent ``os._exit(0)`` on rank 1 (right rank and kind, in seconds), ranks that fork and
start setsid daemons ignoring SIGTERM, Ctrl-C at a random point 0-300 ms into start-up
(both: processes and temp dirs left afterwards), and a checkpoint with one random byte
flipped or one file truncated (was it ever loaded? did the run finish, identical?).

    python bench/bench_faults.py [--reps 20] [--concurrent 20]
    python bench/bench_faults.py --kinds silent fork interrupt corrupt
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import shutil
import signal
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import labkit
from labkit.base.errors import RunFailed
from labkit.launchers.reaper import tagged

_MARK = "LABKIT_BENCH_MARK"


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
            if b"labkit.launchers.rank_main" in cmd and stat[0] != "Z" and int(stat[1]) in (me, 1):
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


def injected_faults(args: argparse.Namespace, report: dict) -> None:
    """Issue 2: raise / exit / kill / hang on rank 1 at step 3, and concurrent runs."""
    before = set(int(x.name) for x in Path("/proc").iterdir() if x.name.isdigit())
    # Baseline: a clean run's wall time (start-up) and median step time.
    base = labkit.run(strategy="ddp", world_size=2, steps=6, threads_per_rank=1)
    report.update({"baseline_wall_s": round(base.wall_s, 3),
                   "median_step_s": round(base.step_time_s, 5), "faults": {}})
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


# ---- issue 14: what students do --------------------------------------------------------------

def _left(tmp: Path, mark: str) -> dict[str, int]:
    """Processes carrying this bench's marker, and entries in its private temp dir (not
    torch's per-user compile cache ``torchinductor_<user>``, which DDP's import creates
    once and every later run reuses: it belongs to no run)."""
    entries = [e for e in os.listdir(tmp) if not e.startswith("torchinductor_")]
    return {"processes": len(tagged(_MARK, mark)), "temp_entries": len(entries)}


def _quits(ctx: Any) -> str:
    import torch

    if ctx.rank == 1:
        time.sleep(0.3)  # rank 0 waits in the all-reduce
        os._exit(0)
    ctx.comm.all_reduce(torch.ones(1))
    return "done"


def silent_exits(reps: int) -> dict[str, Any]:
    rows = []
    for _ in range(reps):
        t0 = time.monotonic()
        try:
            labkit.launch(_quits, 2, timeout_s=60, threads_per_rank=1)
            rows.append((False, time.monotonic() - t0))
        except RunFailed as err:
            rows.append((err.rank == 1 and err.kind == "exit", time.monotonic() - t0))
    return {"trials": reps, "rank_1_exit_named": sum(ok for ok, _ in rows),
            "median_elapsed_s": round(statistics.median(t for _, t in rows), 3),
            "max_elapsed_s": round(max(t for _, t in rows), 3), "timeout_s": 60}


def _forks(ctx: Any, fail: bool) -> int:
    """A plain fork and a setsid daemon, both ignoring SIGTERM (what a student's code did)."""
    def linger() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(1)

    if os.fork() == 0:
        linger()
    middle = os.fork()
    if middle == 0:
        os.setsid()
        if os.fork() == 0:
            linger()
        os._exit(0)
    os.waitpid(middle, 0)
    if fail and ctx.rank == 1:
        raise RuntimeError("fails after forking")
    return ctx.rank


def forking_runs(runs: int, tmp: Path, mark: str) -> dict[str, Any]:
    outcomes = []
    for i in range(runs):
        try:
            labkit.launch(_forks, 2, i % 2 == 1, timeout_s=60, threads_per_rank=1)
            outcomes.append("ok")
        except RunFailed as err:
            outcomes.append(f"rank {err.rank} {err.kind}")
    return {"runs": runs, "outcomes": {o: outcomes.count(o) for o in set(outcomes)},
            "forks_per_run": 4, "left_after": _left(tmp, mark)}


def _sleepy(ctx: Any) -> None:
    time.sleep(60)


def interrupted_start_ups(trials: int, world_size: int, tmp: Path, mark: str) -> dict[str, Any]:
    """Ctrl-C (SIGINT to the main thread) at a uniform random point 0-300 ms into launch."""
    main = threading.main_thread().ident
    assert main is not None
    rng = random.Random(14)
    outcomes, dirty = [], 0
    for _ in range(trials):
        delay, go = rng.uniform(0.0, 0.3), threading.Event()

        def press(delay: float = delay, go: threading.Event = go) -> None:
            go.wait()
            time.sleep(delay)
            signal.pthread_kill(main, signal.SIGINT)

        presser = threading.Thread(target=press)
        presser.start()
        try:
            go.set()
            labkit.launch(_sleepy, world_size, timeout_s=60, threads_per_rank=1)
            outcomes.append("returned")
        except KeyboardInterrupt:
            outcomes.append("KeyboardInterrupt")
        presser.join()
        left = _left(tmp, mark)
        dirty += left["processes"] > 0 or left["temp_entries"] > 0
    return {"trials": trials, "world_size": world_size, "delay_ms": [0, 300],
            "outcomes": {o: outcomes.count(o) for o in set(outcomes)},
            "trials_leaving_something": dirty, "left_after": _left(tmp, mark)}


def corrupt_checkpoints(trials: int, tmp: Path) -> dict[str, Any]:
    """Flip one random byte (or truncate) in one random file of one checkpoint, resume."""
    run = {"strategy": "ddp", "world_size": 2, "steps": 6, "lr": 0.01, "progress": False,
           "timeout_s": 90, "threads_per_rank": 1}
    saved = tmp / "saved"
    ref = labkit.run(**run, options={"checkpoint_dir": str(saved), "checkpoint_every": 2})
    rng = random.Random(14)
    counts = {"damaged_the_newest": 0, "fell_back": 0, "refused": 0, "loaded_damaged": 0,
              "finished_all_steps": 0, "identical_to_undamaged": 0}
    for i in range(trials):
        root = Path(shutil.copytree(saved, tmp / f"trial{i}"))
        step = rng.choice([2, 4, 6])
        counts["damaged_the_newest"] += step == 6
        victim = rng.choice(sorted((root / f"step_{step:08d}").iterdir()))
        data = bytearray(victim.read_bytes())
        if rng.random() < 0.2:
            victim.write_bytes(bytes(data[: rng.randrange(len(data))]))  # truncated
        else:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            victim.write_bytes(bytes(data))
        try:
            res = labkit.run(**run, options={"checkpoint_dir": str(root), "checkpoint_every": 2,
                                             "resume": True})
        except RunFailed:
            counts["refused"] += 1
        else:
            counts["loaded_damaged"] += res.metrics["resumed_from_step"] == step
            counts["fell_back"] += bool(res.metrics.get("checkpoint_fallback"))
            counts["finished_all_steps"] += len(res.losses) == run["steps"]
            counts["identical_to_undamaged"] += res.params_sha256 == ref.params_sha256
        shutil.rmtree(root)
    shutil.rmtree(saved)
    return {"trials": trials, **counts}


def student_faults(args: argparse.Namespace, report: dict) -> None:
    """Issue 14's kinds, in a private TMPDIR, every rank tagged with this bench's marker."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-faults-"))
    os.environ["TMPDIR"], tempfile.tempdir = str(tmp), str(tmp)
    mark = uuid.uuid4().hex
    os.environ[_MARK] = mark
    try:
        if "silent" in args.kinds:
            report["silent_exit_0"] = silent_exits(args.silent_reps)
        if "fork" in args.kinds:
            report["forking_ranks"] = forking_runs(args.fork_runs, tmp, mark)
        if "interrupt" in args.kinds:
            report["interrupted_start_up"] = interrupted_start_ups(
                args.interrupts, args.interrupt_world_size, tmp, mark)
        if "corrupt" in args.kinds:
            ck = Path(tempfile.mkdtemp(prefix="ck-", dir="/var/tmp"))
            report["corrupt_checkpoint"] = corrupt_checkpoints(args.corrupt_trials, ck)
            shutil.rmtree(ck)
        report["left_at_the_end"] = _left(tmp, mark)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kinds", nargs="+", default=["injected", "silent", "fork", "interrupt",
                                                  "corrupt"],
                   choices=["injected", "silent", "fork", "interrupt", "corrupt"])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--concurrent", type=int, default=20)
    p.add_argument("--hang-timeout", type=float, default=6.0)
    p.add_argument("--silent-reps", type=int, default=10)
    p.add_argument("--fork-runs", type=int, default=10)
    p.add_argument("--interrupts", type=int, default=50)
    p.add_argument("--interrupt-world-size", type=int, default=4)
    p.add_argument("--corrupt-trials", type=int, default=20)
    args = p.parse_args()
    report: dict = {}
    if "injected" in args.kinds:
        injected_faults(args, report)
    student_faults(args, report)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
