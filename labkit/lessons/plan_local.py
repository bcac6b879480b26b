"""The planner on this machine: measure the lab GPT's step, then predict the lab's layouts.

Teaches that one model of a step serves a laptop and a cluster, once the laptop's numbers are
measured: ``step_cost`` runs the lesson GPT on one rank and one core at a few sizes
(``SIZES``: depth and batch varied; ``MICRO_SIZES`` at 2 microbatches) by each engine the
lab's layouts use (``ENGINES``: torch DDP, the ZeRO transform, hybrid, the pipeline), fits
``t = step_s + m (microbatch_s + layer_s L) + F / rate`` per engine
(``labkit.theory.plan_local.fit_engine``), times this machine's collectives at 2, 4 and 8
ranks, in wall and CPU seconds (``time_comms``, fitted by ``labkit.theory.plan_comm``), and
caches the result like ``labkit calibrate`` (``labkit.base.cache``).
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
import warnings
from collections.abc import Callable
from typing import Any

from labkit.base.cpuload import cpu_count
from labkit.base.errors import ConfigError, LabError
from labkit.base.progress import Progress
from labkit.lessons.parallel3d import LESSON_GPT
from labkit.theory.plan_comm import COMM_OPS, CommCost, fit_comm, wire_of
from labkit.theory.plan_lab import LAB_BATCH, LAB_GPT, LabLayout
from labkit.theory.plan_local import (
    CACHE,
    CostSample,
    StepCost,
    fit_engine,
    fit_step_cost,
    load_cost,
    store_cost,
)

SIZES = ((2, 8), (4, 4), (4, 16), (8, 8))
"""(layers, batch) of the one-rank runs of every engine: three depths and three batches
(depth moves layers and FLOPs, batch only FLOPs), around the lab's layouts (2-4 layers a
rank, 4-8 sequences a microbatch)."""
MICRO_SIZES = ((2, 8), (4, 16))
"""(layers, batch) run again at 2 microbatches by the engines that take them (hybrid,
pipeline): what a microbatch costs beside its layers and FLOPs."""
ENGINES: dict[str, tuple[str, dict[str, Any]]] = {
    "ddp": ("compress", {"method": "none"}), "zero": ("zero", {"stage": 1}),
    "hybrid": ("hybrid", {}), "pipeline": ("pipeline", {"schedule": "1f1b"})}
"""Each strategy of the lab's layouts: the strategy and options that run its engine on one
rank (``one_rank_step``). DDP's is ``compress`` without compression: torch's
``DistributedDataParallel`` with labkit's traced all-reduce hook, the engine a 2-rank ``ddp``
runs; one-rank ``ddp`` trains the bare model (nothing to average), which measured 1.4 ms a
step less CPU than the wrapped model here (11.6 against 10.1 ms, quiet; docs/benchmarks.md)."""
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


def one_rank_step(layers: int, batch: int, steps: int = STEPS, strategy: str = "ddp",
                  microbatches: int = 1) -> float:
    """Median CPU seconds of a step of the lesson GPT cut to ``layers`` layers, ``batch``
    sequences, by ``strategy``'s engine on one rank with one thread (first step skipped)."""
    import labkit

    model = dataclasses.replace(LESSON_GPT, depth=layers)
    runs_as, options = ENGINES[strategy][0], dict(ENGINES[strategy][1])
    if strategy in ("hybrid", "pipeline"):
        options["microbatches"] = microbatches
    r = labkit.run(strategy=runs_as, model=model, world_size=1, batch_size=batch, steps=steps,
                   threads_per_rank=1, options=options, progress=False)
    return float(r.metrics["step_cpu_s"])


def engine_samples(strategy: str, steps: int = STEPS, rounds: int = 1) -> list[CostSample]:
    """``SIZES`` (and ``MICRO_SIZES`` at 2 microbatches where the engine takes them) run by
    ``strategy``'s engine, each ``rounds`` times, the median kept."""
    sizes = [(layers, batch, 1) for layers, batch in SIZES]
    if strategy in ("hybrid", "pipeline"):
        sizes += [(layers, batch, 2) for layers, batch in MICRO_SIZES]
    return [CostSample(layers=layers, batch=batch, microbatches=m, strategy=strategy,
                       seconds=statistics.median(one_rank_step(layers, batch, steps, strategy, m)
                                                 for _ in range(rounds)))
            for layers, batch, m in sizes]


ENGINE_TRIES = 3
"""Measurements of an engine before its fit's failure stands: on a busy moment one size can
come out so slow that no FLOP-proportional part fits (a rate <= 0; seen quiet, once)."""


def fitted_samples(strategy: str, steps: int = STEPS, rounds: int = 1,
                   note: Callable[[str], None] | None = None) -> list[CostSample]:
    """``engine_samples`` that ``fit_engine`` can fit: measured again, ``ENGINE_TRIES``
    times at most, where noise left no line (``note`` hears why); the last try's error
    stands."""
    samples = engine_samples(strategy, steps, rounds)
    for _ in range(ENGINE_TRIES - 1):
        try:
            fit_engine(samples, LAB_GPT)
            return samples
        except ConfigError as exc:
            if note is not None:
                note(f"{strategy}'s engine: {exc}; measuring it again")
        samples = engine_samples(strategy, steps, rounds)
    fit_engine(samples, LAB_GPT)
    return samples


COMM_RANKS = (2, 4, 8)
"""Ranks of the collective runs: the lab's layouts' rank counts."""
COMM_SIZES = (4_096, 32_768, 262_144, 1_048_576)
"""Message bytes of the collective runs: a LayerNorm's gradient, a tensor-parallel activation
(``b s h`` fp32 of a microbatch), a quarter of the lesson GPT's gradients, and a little more
than all of them (DDP's one bucket)."""
COMM_CALLS = 6
"""Timed calls of an op and size in a row (one block): a step switches op and message size
every few calls, and a long run of one call settles into a lockstep that a step never
reaches (150 in a row priced the hybrids' collectives 20-30 % under their step's)."""
COMM_ROUNDS = 60
"""Blocks of each op and size, every op and size once a round, in reversed order every other
round: a slow spell of the machine falls on every op and size alike instead of on one (issue
32's alternation). Blocks are bimodal here: a 6-call block of 2-rank 32 KB all-reduces took
0.3-0.45 ms a call or 1-4 ms (most likely cores that idle between calls being slow to wake;
not measured), so their mean needs many blocks: over three runs of 20 rounds the 2-rank
all-gather's intercept read 557-923 us, of 60 rounds 679-795 us (docs/benchmarks.md)."""


def time_comms(ctx: Any, sizes: tuple[int, ...], calls: int,
               rounds: int = COMM_ROUNDS) -> dict[str, list[float]]:
    """On every rank of a ``labkit.launch``: the ranks in pairs (0-1, 2-3, ...), each pair's
    all-reduce, reduce-scatter, all-gather and exchange (an isend and an irecv to the partner,
    waited) of
    each size, all pairs at once, each call after a piece of compute as in a step (a layer's
    MLP forward of a 4-sequence microbatch of the lesson GPT: tensor parallelism's f and g
    are half a layer apart). Every op and size runs ``calls`` calls in a block, once per
    round, ``rounds`` rounds (``COMM_ROUNDS``). Returns ``"op:bytes"`` -> [wall s, CPU s]
    per call, the mean over the rounds (a step of 20-90 calls pays their mean, slow blocks
    included; the median of the blocks priced ZeRO-1's step 12-43 % short in three runs):
    the call's own wall time (waiting for the partner to get a core included), and the CPU
    the block took beyond the same compute on a core of its own (``compute_alone``): what a call
    costs amid a step on shared cores, a rank that sleeps and wakes in it included."""
    import time

    import torch
    import torch.distributed as dist

    pairs = [[r, r + 1] for r in range(0, ctx.world_size, 2)]
    if ctx.world_size == 2:
        comm = ctx.comm
    else:
        group, _ = dist.new_subgroups_by_enumeration(pairs)
        comm = ctx.comm.on("pair", group, pairs[ctx.rank // 2])
    peer = 1 - comm.rank
    a, w1, w2 = torch.randn(128, 64), torch.randn(64, 256), torch.randn(256, 64)

    def work() -> None:
        torch.relu(a @ w1) @ w2

    def compute_alone() -> float:
        """The compute's CPU on a core of its own: each rank in turn, the others asleep in
        a barrier (the planner charges compute at its one-rank cost, so whatever sharing
        the cores adds around a call is the call's)."""
        per = 0.0
        for r in range(ctx.world_size):
            ctx.comm.barrier()
            if ctx.rank == r:
                for _ in range(20):
                    work()
                chunks = []
                for _ in range(5):
                    c0 = time.process_time()
                    for _ in range(40):
                        work()
                    chunks.append((time.process_time() - c0) / 40)
                per = statistics.median(chunks)
        ctx.comm.barrier()
        return per

    blocks: list[tuple[str, Any]] = []
    for size in sizes:
        x, full, got = torch.ones(size // 4), torch.empty(size // 4), torch.empty(size // 4)
        half = torch.empty(size // 8)
        blocks += [(f"all_reduce:{size}", lambda x=x: comm.all_reduce(x)),
                   (f"reduce_scatter:{size}", lambda x=x, half=half: comm.reduce_scatter(half, x)),
                   (f"all_gather:{size}", lambda x=x, full=full, size=size:
                    comm.all_gather(full, x[:size // 8])),
                   (f"exchange:{size}", lambda x=x, got=got: [
                       h.wait() for h in (comm.isend(x, peer), comm.irecv(got, peer))])]
    for _, call in blocks:  # warm: every op and size once, untimed
        for _ in range(3):
            work()
            call()
    alone = compute_alone()
    walls: dict[str, list[float]] = {key: [] for key, _ in blocks}
    cpus: dict[str, list[float]] = {key: [] for key, _ in blocks}
    for k in range(rounds):
        for key, call in blocks if k % 2 == 0 else blocks[::-1]:
            ctx.comm.barrier()
            wall, c0 = 0.0, time.process_time()
            for _ in range(calls):
                work()
                t0 = time.perf_counter()
                call()
                wall += time.perf_counter() - t0
            walls[key].append(wall / calls)
            cpus[key].append((time.process_time() - c0) / calls - alone)
    return {key: [statistics.fmean(walls[key]), max(0.0, statistics.fmean(cpus[key]))]
            for key, _ in blocks}


def measure_comms(sizes: tuple[int, ...] = COMM_SIZES, calls: int = COMM_CALLS,
                  ranks: tuple[int, ...] = COMM_RANKS) -> list[CommCost]:
    """``time_comms`` at each of ``ranks`` (a run each), fitted per op and rank count: the
    slowest rank's wall and the ranks' mean CPU per call (``fit_comm``)."""
    import labkit

    fits = []
    for n in ranks:
        per_rank = labkit.launch(time_comms, n, sizes, calls, timeout_s=300,
                                 progress=False).results  # its caller's bar ticks
        for op in COMM_OPS:
            rows = [(size, max(r[f"{op}:{size}"][0] for r in per_rank),
                     statistics.fmean(r[f"{op}:{size}"][1] for r in per_rank)) for size in sizes]
            fits.append(fit_comm(op, n, rows))
    return fits


def measure(steps: int = STEPS, rounds: int = 1, progress: bool | None = None) -> StepCost:
    """Run each engine at ``SIZES`` (``engine_samples``) and fit; time the collectives
    at ``COMM_RANKS`` (``measure_comms``); the 2-rank all-reduce is the wire's alpha-beta.
    About a minute on 2 cores, shown part by part (``labkit.base.progress``)."""
    from labkit.lessons.machine import load_now

    assert (LAB_GPT.hidden, LAB_GPT.seq) == (LESSON_GPT.width, LESSON_GPT.seq_len)
    load = load_now().text()
    comms: list[CommCost] = []
    samples: list[CostSample] = []
    with Progress("measuring this machine", total=len(COMM_RANKS) + len(ENGINES), unit="part",
                  enabled=progress) as shown:
        for n in COMM_RANKS:  # first: the shortest, and the one most likely to fail
            comms += measure_comms(ranks=(n,))
            shown.step(f"collectives at {n} ranks")
        for strategy in ENGINES:
            try:
                samples += fitted_samples(strategy, steps, rounds, shown.note)
            except LabError as exc:  # an engine that cannot run on one rank: DDP's serves it
                if strategy == "ddp":
                    raise
                warnings.warn(f"{strategy}'s engine could not be measured on one rank ({exc}); "
                              f"the planner prices it with DDP's", RuntimeWarning, stacklevel=2)
            shown.step(f"{strategy}'s engine")
    pair = next(c for c in comms if c.op == "all_reduce" and c.ranks == 2)
    alpha, bandwidth = wire_of(pair)
    memory = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    cost = fit_step_cost(samples, LAB_GPT, cores=cpu_count(), alpha_s=alpha,
                         bandwidth_Bps=bandwidth, memory_bytes=memory, load=load)
    return dataclasses.replace(cost, comms=tuple(comms))


def step_cost(refresh: bool = False, steps: int = STEPS, rounds: int = 1) -> StepCost:
    """This machine's cached step cost, measured first where none is cached (or ``refresh``);
    concurrent callers wait for the one that measures."""
    with CACHE.locked() as writable:
        if not writable:  # no cache directory can be made (a read-only HOME): keep nothing
            return measure(steps, rounds)
        cost = None if refresh else load_cost(cpu_count())
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
