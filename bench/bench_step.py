"""One rank's training step through ``labkit.run`` beside the plain PyTorch loop a student
would write (issue 39, item 2): what labkit's machinery costs per step.

Variants, each in a fresh process so none inherits another's warm state:

* ``labkit``: ``labkit.run(strategy="ddp", world_size=1, ...)`` with tracing on (the default);
  step time from the run's timeline (its STEP spans, what labkit reports);
* ``plain``: the same model (``labkit.train.models.build_model``), data (``task_for``),
  optimizer (``make_optimizer``), seed and torch threads, trained by a bare loop -- batch,
  zero_grad, forward, loss, backward, step, ``loss.item()`` -- timed with ``perf_counter``;
* ``plain@rank``: that loop as a ``labkit.launch`` function on one rank: the process labkit's
  rank runs in (forked from the fork server, its group and tracer set up) without labkit's
  step loop, so labkit / plain@rank is what the loop and its tracing cost, and plain@rank /
  plain what the rank's process does to the same loop;
* ``plain+ddp``: that loop with the model wrapped in a 1-rank ``DistributedDataParallel``
  (gloo), what labkit's ``ddp`` strategy wrapped it in before it learnt that one replica has
  nothing to average.

The variants alternate for ``--rounds`` rounds (a busy moment hits every variant alike); the
table prints each variant's median step time over all rounds (the first step of every run
skipped: warm-up) and the ratios of labkit to each (with the range of one round's ratio over
the rounds), for the GPT and the MLP, by three clocks: the wall clock (``wall``), labkit's
wall time from one step loop's clock reading to the next (``loop``, the rank's
``step_seconds``: the STEP span plus what the rank does between steps, the event spool's
write among it; the plain loops' ``wall`` is measured that way) and the CPU time the
training process spent in the step, all its threads (``cpu``, ``time.process_time``;
labkit's from the rank's record), which a shared machine's waits for a core do not inflate;
at the models' default sizes (``RunConfig``: batch 32, gpt width 128 depth 4 seq 64, mlp
width 128 depth 4). Every variant uses ``--threads`` torch threads (default 1).

    python bench/bench_step.py [--rounds 5] [--steps 40] [--threads 1] [--models gpt mlp]
                               [--variants labkit plain plain@rank plain+ddp]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any


def config_for(kind: str, steps: int, threads: int) -> Any:
    from labkit.config.run import RunConfig

    return RunConfig(strategy="ddp", world_size=1, model=kind, steps=steps, progress=False,
                     threads_per_rank=threads)


def plain_loop(kind: str, steps: int, threads: int, ddp: bool) -> dict[str, list[float]]:
    """The loop a student writes, on labkit's model, data and optimizer (in this process)."""
    import torch

    from labkit.train.models import build_model, task_for
    from labkit.train.optim import make_optimizer

    cfg = config_for(kind, steps, threads)
    torch.set_num_threads(cfg.threads())
    torch.manual_seed(cfg.seed)
    model = build_model(cfg)
    if ddp:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        model = DistributedDataParallel(model)
    task = task_for(cfg)
    opt = make_optimizer(cfg.optimizer, list(model.parameters()), cfg.lr)
    out = timed_steps(cfg, model, opt, task)
    if ddp:
        dist.destroy_process_group()
    return out


def timed_steps(cfg: Any, model: Any, opt: Any, task: Any,
                each: Callable[[int], None] | None = None) -> dict[str, list[float]]:
    """``cfg.steps`` steps of the plain loop, each timed by both clocks (``each(step)`` is
    called before a step, outside its time)."""
    walls, cpus = [], []
    for step in range(cfg.steps):
        if each is not None:
            each(step)
        t0, c0 = time.perf_counter(), time.process_time()
        x, y = task.batch(step, cfg.batch_size)
        opt.zero_grad(set_to_none=True)
        loss = task.loss(model(x), y)
        loss.backward()
        opt.step()
        loss.item()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return {"wall": walls, "cpu": cpus, "loop": walls}


def _plain_in_rank(_ctx: Any, kind: str, steps: int, threads: int) -> dict[str, list[float]]:
    return plain_loop(kind, steps, threads, ddp=False)


def plain_in_rank(kind: str, steps: int, threads: int) -> dict[str, list[float]]:
    """The plain loop run by ``labkit.launch`` on one rank (its return travels back)."""
    import labkit

    return labkit.launch(_plain_in_rank, 1, kind, steps, threads,  # type: ignore[no-any-return]
                         threads_per_rank=threads).results[0]


def labkit_steps(kind: str, steps: int, threads: int) -> dict[str, list[float]]:
    """Wall time from the run's timeline (its STEP spans); CPU time from the rank's record."""
    import labkit

    result = labkit.run(config_for(kind, steps, threads))
    record = result.outputs[0].record
    return {"wall": result.timeline.step_times_s(), "cpu": record.step_cpu_seconds,
            "loop": record.step_seconds}


def in_fresh_process(variant: str, kind: str, steps: int, threads: int) -> dict[str, list[float]]:
    out = subprocess.run([sys.executable, __file__, "--one", variant, kind, str(steps),
                          str(threads)],
                         capture_output=True, text=True, check=True, env=dict(os.environ))
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


VARIANTS = ("labkit", "plain", "plain@rank", "plain+ddp")
CLOCKS = ("wall", "loop", "cpu")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--models", nargs="+", default=["gpt", "mlp"])
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads, the same in every variant (default 1: on a shared "
                         "machine two OpenMP threads wait on each other for whole time slices)")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS,
                    help="which variants to run (labkit and plain always run)")
    ap.add_argument("--one", nargs=4, metavar=("VARIANT", "MODEL", "STEPS", "THREADS"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        variant, kind, steps, threads = args.one[0], args.one[1], int(args.one[2]), \
            int(args.one[3])
        print(json.dumps(labkit_steps(kind, steps, threads) if variant == "labkit"
                         else plain_in_rank(kind, steps, threads) if variant == "plain@rank"
                         else plain_loop(kind, steps, threads, ddp=variant == "plain+ddp")))
        return
    print(f"# load {os.getloadavg()[0]:.1f} at start, {os.cpu_count()} cores, "
          f"{args.threads} torch thread(s), {args.rounds} rounds x {args.steps} steps, first "
          f"step of each run skipped")
    variants = [v for v in VARIANTS if v in {"labkit", "plain", *args.variants}]
    for kind in args.models:
        times: dict[str, dict[str, list[float]]] = {v: {c: [] for c in CLOCKS} for v in variants}
        rounds: dict[str, dict[str, list[float]]] = {v: {c: [] for c in CLOCKS}
                                                     for v in variants}  # labkit / v, a round
        for r in range(args.rounds):
            order = variants if r % 2 == 0 else variants[::-1]
            runs = {v: in_fresh_process(v, kind, args.steps, args.threads) for v in order}
            for clock in CLOCKS:
                for variant, run in runs.items():
                    times[variant][clock] += run[clock][1:]
                    rounds[variant][clock].append(statistics.median(runs["labkit"][clock][1:])
                                                  / statistics.median(run[clock][1:]))
        for clock in CLOCKS:
            med = {v: statistics.median(times[v][clock]) for v in variants}
            print(f"{kind} {clock:4}: " + ", ".join(f"{v} {med[v] * 1e3:.3f} ms" for v in variants)
                  + "; " + ", ".join(
                      f"labkit/{v} {med['labkit'] / med[v]:.3f} (rounds "
                      f"{min(rounds[v][clock]):.3f}-{max(rounds[v][clock]):.3f})"
                      for v in variants[1:]))
    print(f"# load {os.getloadavg()[0]:.1f} at end")


if __name__ == "__main__":
    main()
