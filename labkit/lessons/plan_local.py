"""The planner on this machine: measure the lab GPT's step, then predict the lab's layouts.

Teaches that one model of a step serves a laptop and a cluster, once the laptop's numbers are
measured: ``step_cost`` runs the lesson GPT on one rank and one core at a few sizes
(``SIZES``: depth and batch varied), fits ``t = step_s + layer_s L + F / rate``
(``labkit.theory.plan_local.fit_step_cost``), fits this machine's all-reduce
(``labkit.lessons.dedicated.machine_wire``), and caches the result like ``labkit calibrate``.
``run_kwargs`` turns one of the lab's layouts (``labkit.theory.plan_lab.LAYOUTS``) into
``labkit.run``'s arguments; ``bench/bench_plan_local.py`` runs them and prints predicted /
measured. ``python -m labkit.lessons.plan_local [--refresh]`` measures (``labkit plan --gpu
this-machine`` calls it when nothing is cached).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
from typing import Any

from labkit.base.errors import ConfigError
from labkit.lessons.parallel3d import LESSON_GPT
from labkit.theory.plan_lab import LAB_BATCH, LAB_GPT, LabLayout
from labkit.theory.plan_local import (
    CACHE,
    CostSample,
    StepCost,
    cores_here,
    fit_step_cost,
    load_cost,
    store_cost,
)

SIZES = ((2, 4), (2, 8), (4, 4), (4, 8), (4, 16), (8, 8))
"""(layers, batch) of the one-rank runs: two depths at each batch and three batches at depth
4, around the lab's layouts (2-4 layers a rank, 4-8 sequences a microbatch)."""
STEPS = 12
"""Steps of each one-rank run (the first is skipped: it warms up)."""


def run_kwargs(lay: LabLayout, steps: int) -> dict[str, Any]:
    """``labkit.run`` arguments of ``lay`` on the lesson GPT."""
    by_strategy: dict[str, dict[str, Any]] = {
        "hybrid": {"dp": lay.dp, "pp": lay.pp, "tp": lay.tp, "microbatches": lay.microbatches},
        "ddp": {}, "zero": {"stage": lay.zero},
        "pipeline": {"microbatches": lay.microbatches, "schedule": "1f1b"},
    }
    return {"strategy": lay.strategy, "model": LESSON_GPT, "steps": steps,
            "batch_size": LAB_BATCH, "world_size": lay.ranks,
            "options": by_strategy[lay.strategy], "progress": False}


def one_rank_step(layers: int, batch: int, steps: int = STEPS) -> float:
    """Median CPU seconds of a step of the lesson GPT cut to ``layers`` layers, ``batch``
    sequences, on one rank with one thread (first step skipped)."""
    import labkit

    model = dataclasses.replace(LESSON_GPT, depth=layers)
    r = labkit.run(strategy="ddp", model=model, world_size=1, batch_size=batch, steps=steps,
                   threads_per_rank=1, progress=False)
    return float(r.metrics["step_cpu_s"])


def measure(steps: int = STEPS, rounds: int = 1) -> StepCost:
    """Run ``SIZES`` (each ``rounds`` times, the median kept), fit, and fit the wire."""
    from labkit.lessons.dedicated import machine_wire
    from labkit.lessons.machine import load_now

    assert (LAB_GPT.hidden, LAB_GPT.seq) == (LESSON_GPT.width, LESSON_GPT.seq_len)
    load = load_now().text()
    samples = [CostSample(layers=layers, batch=batch,
                          seconds=statistics.median(one_rank_step(layers, batch, steps)
                                                    for _ in range(rounds)))
               for layers, batch in SIZES]
    for _ in range(3):  # the fit comes back empty when a busy machine's times are noise
        try:
            wire = machine_wire(2)
            break
        except TypeError:
            continue
    else:
        raise ConfigError(f"no alpha-beta fit of this machine's all-reduce after 3 tries "
                          f"({load_now().text()}); measure on a quieter machine, e.g. "
                          f"`python -m labkit.lessons.plan_local --refresh`")
    memory = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return fit_step_cost(samples, LAB_GPT, cores=cores_here(), alpha_s=wire.alpha_s,
                         bandwidth_Bps=wire.bandwidth_Bps, memory_bytes=memory, load=load)


def step_cost(refresh: bool = False, steps: int = STEPS, rounds: int = 1) -> StepCost:
    """This machine's cached step cost, measured first where none is cached (or ``refresh``);
    concurrent callers wait for the one that measures."""
    with CACHE.locked() as writable:
        if not writable:  # no cache directory can be made (a read-only HOME): keep nothing
            return measure(steps, rounds)
        cost = None if refresh else load_cost(cores_here())
        if cost is None:
            cost = measure(steps, rounds)
            store_cost(cost)
    return cost


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m labkit.lessons.plan_local",
                                description="Measure this machine's step cost for the planner.")
    p.add_argument("--refresh", action="store_true", help="measure again")
    p.add_argument("--rounds", type=int, default=1, help="runs of each size (median kept)")
    args = p.parse_args(argv)
    print(json.dumps(step_cost(args.refresh, rounds=args.rounds).to_json()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
