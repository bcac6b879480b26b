"""Ranks pinned one per core where the cores allow (issue 32, item 1), read from inside real
ranks: rank r's main thread runs on the cores ``labkit.rank.pinning.plan`` gives it, the
run's timeline meta says so, more ranks than cores stay unpinned (and say why), the opt-out
unpins, and a warm pool rank re-pins (or gives the cores back) per job."""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest

import labkit
from labkit.base.devices import default_threads_per_rank
from labkit.rank.pinning import PIN_ENV, plan, usable_cores

pytestmark = [pytest.mark.distributed, pytest.mark.xdist_group("serial"),
              pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux only")]


@pytest.fixture(autouse=True)
def _pinning_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pinning is opt-in (``labkit.rank.pinning.pin_enabled``): these runs opt in."""
    monkeypatch.setenv(PIN_ENV, "1")


def affinity(ctx: Any) -> list[int]:
    """The cores of this rank's main thread (the one that computes)."""
    return sorted(os.sched_getaffinity(0))


def expected(rank: int, world_size: int, *, enabled: bool = True) -> list[int]:
    usable = usable_cores()
    cores = plan(rank, world_size, default_threads_per_rank(world_size), usable,
                 enabled=enabled).cores
    return sorted(cores if cores is not None else usable)


@pytest.mark.parametrize("world_size", [2, 3])
def test_each_rank_runs_on_the_cores_the_rule_gives_it(world_size: int) -> None:
    with warnings.catch_warnings():  # 3 ranks on 2 cores warn that they share them
        warnings.simplefilter("ignore")
        res = labkit.launch(affinity, world_size, timeout_s=60)
    for rank, cores in enumerate(res.results):
        assert cores == expected(rank, world_size), (
            f"rank {rank} of {world_size}: main thread on {cores}, "
            f"expected {expected(rank, world_size)}")
    meta = res.timeline.meta["pinning"]
    fits = world_size <= len(usable_cores())
    assert meta["pinned"] is fits, meta
    if fits:
        assert meta["cores"] == [expected(r, world_size) for r in range(world_size)]
        assert meta["reason"].startswith(f"pinned: {world_size} ranks on ")
    else:
        assert meta["cores"] == [None] * world_size
        assert meta["reason"] == (f"not pinned: {world_size} ranks share "
                                  f"{len(usable_cores())} usable cores")


def test_the_opt_out_leaves_every_core_to_every_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PIN_ENV, "0")
    res = labkit.launch(affinity, 2, timeout_s=60)
    for rank, cores in enumerate(res.results):
        assert cores == expected(rank, 2, enabled=False), (rank, cores)
    assert res.timeline.meta["pinning"]["reason"] == f"not pinned ({PIN_ENV}=1 pins)"


def test_a_strategy_run_records_its_pinning_and_a_pool_pins_per_job() -> None:
    """``labkit.run``'s timeline carries the pinning a lesson prints; a warm pool's ranks pin
    for each job from the cores they started with, not the one core the last job left them."""
    if len(usable_cores()) < 2:
        pytest.skip("one usable core: two ranks never fit")
    run = labkit.run(strategy="ddp", world_size=2, steps=2, progress=False)
    assert run.timeline.meta["pinning"]["pinned"] is True
    with labkit.Pool(2) as pool:
        for _ in range(2):
            again = pool.launch(affinity)
            assert list(again.results) == [expected(0, 2), expected(1, 2)]
