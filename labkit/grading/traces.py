"""Recorded timelines for problem set 4 (seed 003, Level III): real runs, one bottleneck each.

A student gets a timeline and must name the bottleneck and the lever that fixes it, so
every trace here is a real labkit run on this machine with one cause injected:

* ``slow_stage``: a 1F1B pipeline of 4 stages (``labkit.run("pipeline")``) whose layers on
  one stage cost ``SLOW_FACTOR`` times the others (``--layer-costs``), split by layer
  count: the slow stage sets the pace and the others wait (seed 003's 1.2x -> 3.4x story);
* ``slow_link``: data-parallel steps whose gradient all-reduce is a ring of send / recv
  with every receive posted up front, and one rank's outgoing link emulated slow
  (``Comm.emulate_slow_link``: the rank sleeps bytes / bandwidth inside each send);
* ``exposed_allreduce``: ``ddp-naive`` (one blocking all-reduce per parameter after the
  backward) on a wide model at a small batch, so communication sits in the open.

Saved traces are bare ``Timeline`` JSON: events only, no label, no configuration. The
instructor's ``labkit course traces`` (``cli``) records the public examples into
``solutions/ps4_reasoning/traces/`` and the hidden ones into
``solutions/_grading/ps4_traces/``, and keeps a trace only when the instructor's own
analysis recovers the injected cause from the timeline's numbers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.analysis.timeline import Timeline
from labkit.base.errors import ConfigError
from labkit.base.events import Lane, Op
from labkit.base.progress import each
from labkit.rank.context import RankContext

KINDS = ("slow_stage", "slow_link", "exposed_allreduce")
SLOW_FACTOR = 4  # the slow stage's layers cost this many times the others
LINK_BPS = 20e6  # the slow link: 20 MB/s (loopback here moves hundreds of MB/s to GB/s)


@dataclass(frozen=True)
class TraceSpec:
    """What to inject: the kind, where (a rank or stage; None for exposed all-reduce)."""

    kind: str
    rank: int | None
    world_size: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"kind ({self.kind!r}) must be one of {', '.join(KINDS)}")
        if self.kind != "exposed_allreduce" and not (
                self.rank is not None and 0 <= self.rank < self.world_size):
            raise ConfigError(f"rank ({self.rank!r}) must be 0..{self.world_size - 1} for "
                              f"{self.kind}; e.g. rank=1")


def preposted_ring(comm: Any, tensor: Any, step: int) -> None:
    """A ring all-reduce (sum, in place) that posts all its receives before sending.

    Each message lands in a buffer that is already waiting, so a SEND span lasts as long
    as the sender's own link needs, and a slow link shows on its own rank only (in a
    ring whose receives are posted step by step, every rank's sends would wait for the
    slow one's neighbour and look slow too).
    """
    import torch

    from labkit.strategies.collectives.ring import chunk_bounds

    n, r = comm.world_size, comm.rank
    flat = tensor.view(-1)
    chunks = [flat[a:b] for a, b in chunk_bounds(flat.numel(), n)]
    right, left = (r + 1) % n, (r - 1) % n
    # 1. every receive of both phases, posted now, each into its own buffer
    rs = [torch.empty_like(chunks[(r - s - 1) % n]) for s in range(n - 1)]
    ag = [torch.empty_like(chunks[(r - s) % n]) for s in range(n - 1)]
    pending = [comm.irecv(b, left, step=step, name=f"RS{s}") for s, b in enumerate(rs)]
    pending += [comm.irecv(b, left, step=step, name=f"AG{s}") for s, b in enumerate(ag)]
    # 2. reduce-scatter, then 3. all-gather, sending as soon as the data is ready
    for s in range(n - 1):
        comm.isend(chunks[(r - s) % n].clone(), right, step=step, name=f"RS{s}").wait()
        pending[s].wait()
        chunks[(r - s - 1) % n].add_(rs[s])
    for s in range(n - 1):
        comm.isend(chunks[(r + 1 - s) % n].clone(), right, step=step, name=f"AG{s}").wait()
        pending[n - 1 + s].wait()
        chunks[(r - s) % n].copy_(ag[s])


def slow_link_steps(ctx: RankContext, steps: int, width: int, slow_rank: int,
                    link_Bps: float) -> None:
    """Rank code: forward, backward, then a ring all-reduce of the gradient."""
    import torch

    if ctx.rank == slow_rank:
        ctx.comm.emulate_slow_link(link_Bps)
    g = torch.Generator().manual_seed(ctx.rank)
    x = torch.randn(256, width, generator=g)
    w = torch.randn(width, width, generator=g, requires_grad=True)
    for step in range(steps):
        with ctx.tracer.span(Op.STEP, step=step):
            with ctx.tracer.span(Op.FORWARD, step=step):
                loss = torch.relu(x @ w).pow(2).mean()
            with ctx.tracer.span(Op.BACKWARD, step=step):
                loss.backward()
            assert w.grad is not None
            preposted_ring(ctx.comm, w.grad, step)
            w.grad = None


def record(spec: TraceSpec) -> Timeline:
    """One real run with the injected cause; its timeline without labels."""
    from labkit.api import launch, run
    from labkit.config.run import ModelConfig, RunConfig

    if spec.kind == "slow_stage":
        costs = tuple(SLOW_FACTOR if layer // 2 == spec.rank else 1
                      for layer in range(2 * spec.world_size))
        result = run(RunConfig(strategy="pipeline", world_size=spec.world_size, steps=3,
                               batch_size=256, seed=spec.seed, progress=False, backend="gloo",
                               threads_per_rank=1,
                               model=ModelConfig(width=256, depth=2 * spec.world_size),
                               options={"schedule": "1f1b", "microbatches": 8,
                                        "layer_costs": costs}))
        timeline = result.timeline
    elif spec.kind == "exposed_allreduce":
        result = run(RunConfig(strategy="ddp-naive", world_size=spec.world_size, steps=4,
                               batch_size=4, seed=spec.seed, progress=False, backend="gloo",
                               threads_per_rank=1,
                               model=ModelConfig(width=768, depth=4)))
        timeline = result.timeline
    else:
        assert spec.rank is not None
        timeline = launch(slow_link_steps, spec.world_size, 4, 384, spec.rank, LINK_BPS,
                          seed=spec.seed, threads_per_rank=1).timeline
    return bare(timeline)


def bare(timeline: Timeline) -> Timeline:
    """The events only: no metadata that could name the cause."""
    keep = [e for e in timeline.events if e.lane in (Lane.COMPUTE, Lane.COMM, Lane.STEP)]
    return Timeline(keep, timeline.world_size)


def save(timeline: Timeline, path: Path) -> Path:
    """Compact JSON (a few tens of kB per trace)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(timeline.to_json(), separators=(",", ":")))
    return path


def generate(specs: dict[str, TraceSpec], folder: Path,
             analyze: Callable[[Timeline], tuple[str, int | None]],
             attempts: int = 3, progress: bool | None = None) -> dict[str, Any]:
    """Record every spec into ``folder/<name>.json``, keeping only recoverable traces.

    ``analyze`` (the instructor's) must name the injected kind and rank from the
    timeline's numbers; a run where noise hid the cause is recorded again. Each is a real
    run: one bar counts the traces recorded (``progress``: ``labkit.base.progress``'s rule).
    """
    report: dict[str, Any] = {}
    for name, spec in each(list(specs.items()), f"recording traces in {folder.name}",
                           name=lambda item: item[0], unit="trace", progress=progress):
        for attempt in range(1, attempts + 1):
            timeline = record(spec)
            found = analyze(timeline)
            if found == (spec.kind, spec.rank):
                path = save(timeline, folder / f"{name}.json")
                report[name] = {"kind": spec.kind, "rank": spec.rank, "attempts": attempt,
                                "events": len(timeline.events),
                                "kB": round(path.stat().st_size / 1000, 1)}
                break
        else:
            raise ConfigError(f"trace {name}: after {attempts} runs the analysis found "
                              f"{found}, not {(spec.kind, spec.rank)}; the machine is too "
                              "busy for the injected cause to show, try again later")
    return report
