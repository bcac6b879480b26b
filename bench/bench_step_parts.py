"""Where a one-rank step's time goes inside the rank (issue 39, item 2): what
``bench_step.py``'s whole-process ratios cannot split, measured in one process.

* ``inner``: a labkit rank's own loop (``RankGroup.run`` of a one-rank ``ddp`` job with the
  event spool and the status board on, as ``labkit.run`` runs it), then a plain loop on the
  very same model, optimizer and task objects; each step's process CPU time, medians over
  all runs (the first step of each skipped), and a plain loop on fresh objects as the
  reference. labkit / same objects is what labkit's loop and
  tracing cost, with no difference of process, memory layout or objects;
* ``bytecodes``: the Python bytecodes one steady step executes (``sys.settrace`` opcode
  events, a count that load does not change), labkit's loop against the plain loop, by
  function, labkit's extra first;
* ``clocks``: what four readings of each clock cost inside a real plain step (between its
  phases), the thread-CPU clock a compute span reads among them.

    python bench/bench_step_parts.py inner [--runs 16] [--steps 60] [--model mlp]
    python bench/bench_step_parts.py bytecodes [--model mlp]
    python bench/bench_step_parts.py clocks [--rounds 20] [--model mlp]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any


def _config(model: str, steps: int) -> Any:
    from labkit.config.run import RunConfig

    return RunConfig(strategy="ddp", world_size=1, model=model, steps=steps, progress=False,
                     threads_per_rank=1)


def _objects(cfg: Any) -> tuple[Any, Any, Any]:
    from labkit.train.models import build_model, task_for
    from labkit.train.optim import make_optimizer

    model = build_model(cfg)
    return model, make_optimizer(cfg.optimizer, list(model.parameters()), cfg.lr), task_for(cfg)


def plain_steps(cfg: Any, model: Any, opt: Any, task: Any,
                each: Callable[[int], None] | None = None) -> list[float]:
    """``bench_step.py``'s plain loop on these objects; each step's process CPU seconds."""
    from bench_step import timed_steps  # this script's folder is on sys.path when it runs

    return timed_steps(cfg, model, opt, task, each)["cpu"]


def in_a_rank(cfg: Any, runs: int, after: Callable[[Any, int], None]) -> None:
    """``runs`` one-rank ddp jobs in this process, ``after(loop, run)`` once each finished."""
    import torch.distributed as dist

    from labkit.launchers.board import Board
    from labkit.launchers.jobs import job_for
    from labkit.rank.group import RankGroup
    from labkit.train import loop as train_loop

    run = train_loop.TrainLoop.run
    done = [0]

    def traced_run(self: Any) -> Any:  # the loop's own run, then ``after`` on its objects
        out = run(self)
        after(self, done[0])
        done[0] += 1
        return out

    tmp = tempfile.mkdtemp(prefix="bench-step-parts-")
    board = Board.create(os.path.join(tmp, "board"), 1)
    group = RankGroup.open("gloo", 0, 1, timeout_s=120, store=dist.HashStore())
    setattr(train_loop.TrainLoop, "run", traced_run)  # noqa: B010 - this bench only
    try:
        for _ in range(runs):
            group.run(job_for(cfg), status=board.status(0), progress=board.steps(0),
                      spool_dir=tempfile.mkdtemp(dir=tmp))
    finally:
        setattr(train_loop.TrainLoop, "run", run)  # noqa: B010
        group.close()
        board.close()


def inner(args: argparse.Namespace) -> None:
    cfg = _config(args.model, args.steps)
    cpu: dict[str, list[float]] = {"labkit": [], "same objects": [], "fresh objects": []}

    def after(loop: Any, run: int) -> None:
        cpu["labkit"] += loop.record.step_cpu_seconds[1:]
        cpu["same objects"] += plain_steps(cfg, loop.model, loop.optimizer, loop.task)[1:]
        cpu["fresh objects"] += plain_steps(cfg, *_objects(cfg))[1:]

    in_a_rank(cfg, args.runs, after)
    fresh = statistics.median(cpu["fresh objects"])
    for name, values in cpu.items():
        print(f"{name:14} cpu {statistics.median(values) * 1e6:7.1f} us a step, "
              f"{statistics.median(values) / fresh:.3f} x fresh objects")


def bytecodes(args: argparse.Namespace) -> None:
    cfg = _config(args.model, 4)
    counts: dict[str, collections.Counter[str]] = {"labkit": collections.Counter(),
                                                   "plain": collections.Counter()}
    counting = ["labkit"]

    def trace(frame: Any, event: str, _arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            path = frame.f_code.co_filename.split("site-packages/")[-1]
            counts[counting[0]][f"{path.split('/labkit/')[-1]}:{frame.f_code.co_name}"] += 1
        return trace

    def watch(name: str) -> Callable[[int], None]:
        def each(step: int) -> None:  # from the start of step 2 to the start of step 3
            counting[0] = name
            sys.settrace(trace if step == 2 else None)
        return each

    from labkit.train import loop as train_loop

    step = train_loop.TrainLoop.train_step

    def watched_step(self: Any, s: int) -> None:
        watch("labkit")(s)
        step(self, s)

    def after(loop: Any, _run: int) -> None:
        setattr(train_loop.TrainLoop, "train_step", step)  # noqa: B010
        plain_steps(cfg, loop.model, loop.optimizer, loop.task, each=watch("plain"))
        sys.settrace(None)

    setattr(train_loop.TrainLoop, "train_step", watched_step)  # noqa: B010 - this bench only
    in_a_rank(cfg, 1, after)
    for name, c in counts.items():
        print(f"{name}: {sum(c.values())} bytecodes in one step")
    extra = counts["labkit"].copy()
    extra.subtract(counts["plain"])
    for where, n in sorted(extra.items(), key=lambda kv: -abs(kv[1]))[:30]:
        if n:
            print(f"{n:+6d} {where}")


def clocks(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    cfg = _config(args.model, 60)
    model, opt, task = _objects(cfg)
    reads: dict[str, Callable[[], Any]] = {
        "none": lambda: 0, "monotonic_ns": time.monotonic_ns,
        "thread_time_ns": time.thread_time_ns, "process_time_ns": time.process_time_ns}
    spent: dict[str, list[int]] = {k: [] for k in reads}
    for _ in range(args.rounds):
        for name, read in reads.items():
            for step in range(cfg.steps):
                x, y = task.batch(step, cfg.batch_size)
                opt.zero_grad(set_to_none=True)
                t0 = time.perf_counter_ns()
                read()
                loss = task.loss(model(x), y)
                read()
                loss.backward()
                read()
                opt.step()
                read()
                if step:
                    spent[name].append(time.perf_counter_ns() - t0)
    base = statistics.median(spent["none"])
    for name, values in spent.items():
        print(f"{name:16} forward+backward+optimizer {statistics.median(values) / 1e3:7.1f} us, "
              f"four reads {(statistics.median(values) - base) / 1e3:+5.1f} us")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("inner", "bytecodes", "clocks"))
    ap.add_argument("--runs", type=int, default=16)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--model", default="mlp", choices=("mlp", "gpt"))
    args = ap.parse_args()
    print(f"# load {os.getloadavg()[0]:.1f}")
    {"inner": inner, "bytecodes": bytecodes, "clocks": clocks}[args.what](args)
    print(f"# load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
