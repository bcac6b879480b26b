"""Sleeping or polling while gloo works: the comm time of a ddp-naive step, both ways.

    python bench/bench_comm_wait.py [--rounds 2] [--steps 10]

Two measurements, each alternating the ways of waiting in one run (``labkit.trace.comm``'s
``LABKIT_COMM_WAIT``):

1. plain torch (no labkit): 2 processes, 1 thread each, a little compute and then the ten
   all-reduces a ddp-naive step of lesson 01's 512 x 4 MLP issues (3 x 1 MB and 7 small),
   15 steps a variant per round, 6 rounds: ``block`` (``dist.all_reduce``), ``spin``
   (``async_op=True``, then poll ``is_completed`` and ``os.sched_yield`` between polls) and
   ``async`` (``async_op=True``, then ``wait``). Prints each variant's comm time per step:
   least, 25th percentile, median, 90th percentile;
2. labkit's own ``ddp-naive`` on 2 ranks (the same model, ``--steps`` steps), ``sleep`` and
   ``spin`` alternated ``--rounds`` times: each run's median and least step and its exposed
   communication per step (``dp_lesson.step_split_ms``).

A wait that sleeps lets its core idle, and waking costs a scheduler round trip -- on a
virtual machine a halted virtual CPU. Ratios and spreads only: the machine swings.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES = (10, 5120, 512, 262144, 512, 262144, 512, 262144, 512, 16384)
"""Floats per all-reduce of one ddp-naive step of the 512 x 4 MLP, in the order it sends."""
WAYS = ("block", "spin", "async")


def _plain_rank(rank: int, port: int) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    a, w = torch.randn(64, 512), torch.randn(512, 512)
    tensors = [torch.ones(n) for n in SIZES]
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    for _ in range(6):
        for way in WAYS:
            for step in range(15):
                for _ in range(6):
                    (a @ w).sum()
                t0 = time.perf_counter()
                for t in tensors:
                    if way == "block":
                        dist.all_reduce(t)
                        continue
                    work = dist.all_reduce(t, async_op=True)
                    while way == "spin" and not work.is_completed():
                        os.sched_yield()
                    work.wait()
                if step >= 2:  # the first steps of a variant warm up
                    times[way].append((time.perf_counter() - t0) * 1e3)
    if rank == 0:
        for way, xs in times.items():
            xs.sort()
            print(f"  {way:6s} comm per step (ms): least {xs[0]:5.2f}  p25 {xs[len(xs) // 4]:5.2f}"
                  f"  median {statistics.median(xs):5.2f}  p90 {xs[int(0.9 * len(xs))]:5.2f}",
                  flush=True)
    dist.destroy_process_group()


def plain() -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print("plain torch, 2 ranks, ten all-reduces a step (6 rounds x 15 steps, alternated):")
    mp.spawn(_plain_rank, args=(port,), nprocs=2)


def labkits(rounds: int, steps: int) -> None:
    import labkit
    from labkit.config.run import ModelConfig
    from labkit.lessons.dp_lesson import step_split_ms

    print(f"labkit ddp-naive, 2 ranks, 512 x 4 MLP, {steps} steps a run (medians over steps "
          f"after the first):")
    model = ModelConfig(width=512, depth=4)
    ratios = []
    for rnd in range(rounds):
        got = {}
        for way in ("sleep", "spin"):
            os.environ["LABKIT_COMM_WAIT"] = way
            r = labkit.run(strategy="ddp-naive", world_size=2, steps=steps, model=model,
                           progress=False)
            times = [t * 1e3 for t in r.timeline.step_times_s()[1:]]
            got[way] = statistics.median(times)
            print(f"  round {rnd} {way:5s}: step median {got[way]:6.2f} ms, least "
                  f"{min(times):6.2f}, exposed comm {step_split_ms(r)['exposed_ms']:6.2f} ms",
                  flush=True)
        ratios.append(got["sleep"] / got["spin"])
    os.environ.pop("LABKIT_COMM_WAIT", None)
    print(f"  sleep / spin, median step, per round: {' '.join(f'{x:.2f}' for x in ratios)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()
    from labkit.base.cpuload import others_now

    print(f"other programs' CPU before: {others_now():.2f} cores")
    plain()
    labkits(args.rounds, args.steps)


if __name__ == "__main__":
    main()
