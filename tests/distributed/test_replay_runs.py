"""The dedicated-core replay on real runs (issue 32, item 3): DDP (naive, bucketed), GPipe,
1F1B and the parameter server's straggler replay without error, keep every span and its order
on each rank, never let a message arrive before it was sent or a collective end before its
last rank reached it, and take the measured wait for a core out. On a quiet machine (ranks <=
cores, load under half the cores) the replayed pipeline step is within 15 % of the measured
one, and naive DDP's (bucketed DDP's is not: xfail, with why); on a busy one that check is
skipped with the load it saw (``bench/bench_replay.py`` prints both)."""

from __future__ import annotations

from typing import Any

import pytest

import labkit
from labkit.analysis.replay import replay
from labkit.base.cpuload import busy_limit, cpu_sample, others_cores
from labkit.base.events import Lane, Op, match_sends
from labkit.config import ModelConfig
from labkit.lessons.dedicated import dedicated, machine_wire, replay_text
from labkit.lessons.machine import load_now, sharing_cores

pytestmark = [pytest.mark.distributed, pytest.mark.xdist_group("serial")]

MLP = ModelConfig(width=256, depth=4)
CASES: dict[str, dict[str, Any]] = {
    "ddp-naive": {"strategy": "ddp-naive", "model": MLP},
    "ddp-bucketed": {"strategy": "ddp-bucketed", "model": MLP, "options": {"bucket_cap_mb": 0.25}},
    "gpipe": {"strategy": "pipeline", "batch_size": 256,
              "options": {"schedule": "gpipe", "microbatches": 4}},
    "1f1b": {"strategy": "pipeline", "batch_size": 256,
             "options": {"schedule": "1f1b", "microbatches": 4}},
    "ps straggler": {"strategy": "ps", "world_size": 3, "options": {"straggler": "2:3"}},
}


@pytest.fixture(scope="module")
def wire() -> Any:
    return None  # the run's own typical messages (labkit.lessons.dedicated's default)


def test_a_benchmark_wire_replays_too() -> None:
    """Given an alpha-beta wire (this machine's built-in all-reduce, fitted once per kernel),
    the replay times every message by it instead."""
    run = labkit.run(strategy="ddp-naive", world_size=2, steps=3, model=MLP, progress=False)
    rep = replay(run.timeline, machine_wire(2))
    assert rep.wire is not None and rep.timeline.meta["replay"]["model"].endswith("alpha-beta wire")
    assert rep.median_step_s() > 0


@pytest.mark.parametrize("name", list(CASES))
def test_a_real_run_replays_in_order_and_without_the_wait(name: str, wire: Any) -> None:
    before = load_now(fresh=True)
    during = cpu_sample()  # the other xdist worker may start a lesson between two readings
    with sharing_cores():  # the straggler's three ranks share two cores on purpose
        run = labkit.run(**{"world_size": 2, "steps": 5, "progress": False, "timeout_s": 120,
                            **CASES[name]})
    rep = replay(run.timeline, wire)
    old, new = list(run.timeline), list(rep.timeline)
    assert len(new) == len(old), f"{name}: {len(old)} spans measured, {len(new)} replayed"
    for r in run.timeline.ranks:  # every rank's spans, in the order it ran them
        names = [(e.op, e.step) for e in old if e.rank == r and e.lane is not Lane.STEP]
        again = sorted((e for e in new if e.rank == r and e.lane is not Lane.STEP),
                       key=lambda e: e.start_ns)
        assert sorted(names, key=str) == sorted([(e.op, e.step) for e in again], key=str)
    for send, recv in match_sends(new):
        assert recv.end_ns >= send.start_ns, f"{name}: a message arrived before it was sent"
    for e in new:
        if e.lane is Lane.COMPUTE:
            assert e.cpu_ns is None or e.dur_ns <= max(e.cpu_ns, 0) + 1, e
    measured, modelled = run.timeline.median_step_s(), rep.median_step_s()
    assert modelled > 0, name
    text = replay_text(run, dedicated(run, wire))
    assert "replayed on dedicated cores (a model built from this run)" in text, text
    ranks = run.config.world_size
    others = others_cores(during, cpu_sample())
    after = load_now(fresh=True)
    quiet = (not before.busy and not after.busy and ranks <= before.cores
             and others <= busy_limit(before.cores))
    if not quiet:
        pytest.skip(f"{name}: the replay's accuracy is checked on a quiet machine only "
                    f"({after.text()}; {others:.1f} cores over the run; {ranks} ranks): "
                    f"replayed {modelled * 1e3:.1f} ms, measured {measured * 1e3:.1f} ms")
    within = abs(modelled - measured) <= 0.15 * measured
    if name == "ddp-bucketed" and not within:
        pytest.xfail(f"{name}: replayed {modelled * 1e3:.1f} ms vs measured {measured * 1e3:.1f} ms "
                     "quiet -- the measured step keeps waits for a core that 2 ranks with "
                     "gloo's threads meet on 2 cores even quiet (a forward at a third of a "
                     "core, a rank woken 2 ms after its last bucket was done) and the replay "
                     "takes out: 0.71-0.87x where it missed (docs/benchmarks.md, issue 32)")
    assert within, (
        f"{name} on a quiet machine: replayed {modelled * 1e3:.1f} ms vs measured "
        f"{measured * 1e3:.1f} ms ({modelled / measured:.2f}x)")


def test_every_collective_ends_after_its_last_rank_reached_it(wire: Any) -> None:
    run = labkit.run(strategy="ddp-naive", world_size=2, steps=3, model=MLP, progress=False)
    by_rank: dict[int, list[Any]] = {}
    for e in replay(run.timeline, wire).timeline:
        if e.op is Op.ALL_REDUCE:
            by_rank.setdefault(e.rank, []).append(e)
    a, b = (sorted(v, key=lambda e: e.start_ns) for v in by_rank.values())
    for x, y in zip(a, b, strict=True):
        assert x.end_ns == y.end_ns >= max(x.start_ns, y.start_ns)
