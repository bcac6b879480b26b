"""The planner's one-rank engine runs (``labkit.lessons.plan_local``, issue 38 item 4): each
of the lab's engines runs on one rank and reports the step's CPU time it is fitted to, and
DDP's is the wrapped engine a 2-rank ``ddp`` runs (torch DDP and labkit's traced hook), not
one-rank ``ddp``'s bare model."""

from __future__ import annotations

import dataclasses

import pytest

import labkit
from labkit.lessons.parallel3d import LESSON_GPT
from labkit.lessons.plan_local import ENGINES, one_rank_step, time_comms
from labkit.theory.plan_comm import COMM_OPS

pytestmark = [pytest.mark.distributed, pytest.mark.lesson13]


@pytest.mark.parametrize("strategy", sorted(ENGINES))
def test_each_engine_runs_on_one_rank_and_reports_its_cpu(strategy: str) -> None:
    m = 2 if strategy in ("hybrid", "pipeline") else 1
    assert one_rank_step(2, 4, steps=3, strategy=strategy, microbatches=m) > 0


def test_ddps_engine_is_the_wrapped_model_with_its_hook() -> None:
    runs_as, options = ENGINES["ddp"]
    model = dataclasses.replace(LESSON_GPT, depth=2)
    common = dict(model=model, world_size=1, batch_size=4, steps=3, threads_per_rank=1,
                  progress=False)
    wrapped = labkit.run(strategy=runs_as, options=options, **common)
    bare = labkit.run(strategy="ddp", **common)
    assert wrapped.metrics["buckets"] >= 1  # DDP's reducer handed buckets to the hook
    assert bare.metrics["buckets"] == 0  # nothing to average, no wrapper


def test_collectives_are_timed_in_alternating_blocks_at_every_rank_count() -> None:
    """``time_comms`` on 4 ranks (two pairs at once): every op and size is priced, each as a
    mean over its rounds of short blocks; a wall per call above zero and a CPU at or above
    zero."""
    sizes = (4_096, 262_144)
    per_rank = labkit.launch(time_comms, 4, sizes, 2, 3, timeout_s=120).results
    assert len(per_rank) == 4
    for costs in per_rank:
        assert set(costs) == {f"{op}:{s}" for op in COMM_OPS for s in sizes}
        assert all(wall > 0 and cpu >= 0 for wall, cpu in costs.values())
