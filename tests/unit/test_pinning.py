"""``labkit.rank.pinning``: one rank per core where the cores allow (issue 32, item 1), pinned
as pure data (which cores each rank takes, or why none) and on this process's own threads."""

from __future__ import annotations

import os
import threading

import pytest

from labkit.rank import pinning
from labkit.rank.pinning import PIN_ENV, Pinning, plan, run_meta


def test_ranks_that_fit_take_one_core_each_in_rank_order():
    usable = (2, 3, 5, 7)
    got = [plan(r, 4, 1, usable).cores for r in range(4)]
    assert got == [(2,), (3,), (5,), (7,)]
    assert plan(0, 4, 1, usable).reason == "pinned: 4 ranks on 4 usable cores, 1 core each"


def test_spare_cores_go_to_a_ranks_threads_but_never_past_its_share():
    usable = tuple(range(8))
    assert [plan(r, 2, 4, usable).cores for r in range(2)] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert plan(1, 2, 8, usable).cores == (4, 5, 6, 7)  # 8 threads, but 4 cores are its share
    assert plan(2, 3, 2, usable).cores == (4, 5)  # 3 ranks x 2: cores 6 and 7 stay free


def test_more_ranks_than_cores_are_not_pinned_and_say_so():
    got = plan(1, 3, 1, (0, 1))
    assert got.cores is None and got.usable == 2
    assert got.reason == "not pinned: 3 ranks share 2 usable cores"


def test_the_opt_out_and_a_system_without_affinity_leave_ranks_unpinned():
    assert plan(0, 2, 1, (0, 1), enabled=False).reason == f"not pinned ({PIN_ENV}=1 pins)"
    assert plan(0, 1, 1, ()).cores is None
    assert plan(0, 1, 1, (0, 1)).reason == "not pinned: one rank, no peer to keep apart"


def test_the_run_meta_says_every_rank_was_pinned_only_when_each_was():
    a = Pinning(cores=(0,), usable=2, reason="pinned: 2 ranks on 2 usable cores, 1 core each")
    b = Pinning(cores=(1,), usable=2, reason=a.reason)
    assert run_meta([a, b]) == {"pinned": True, "cores": [[0], [1]], "reason": a.reason}
    off = Pinning(cores=None, usable=2, reason="not pinned: 3 ranks share 2 usable cores")
    assert run_meta([off, off, off])["pinned"] is False
    assert run_meta([a, None])["pinned"] is False  # a launcher that did not record one rank
    assert run_meta([])["reason"] == "not recorded by this launcher"


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="Linux with two usable cores (rank 0 of 2 pins to the first)")
def test_pinning_moves_the_main_thread_and_what_it_starts_and_unpinning_undoes_it(monkeypatch):
    """In this process: the calling (main) thread and a thread it starts afterwards run on the
    rank's core; a thread that existed before (gloo's) keeps every core; a later job that may
    not pin gets every usable core back."""
    monkeypatch.setenv(PIN_ENV, "1")
    usable = pinning.usable_cores()
    seen: dict[str, set[int]] = {}
    go = threading.Event()

    def look(name: str) -> None:
        go.wait()
        seen[name] = os.sched_getaffinity(0)

    before = threading.Thread(target=look, args=("before",))
    before.start()
    try:
        got = pinning.pin_rank(0, 2, 1)
        after = threading.Thread(target=look, args=("after",))
        after.start()
        go.set()
        before.join()
        after.join()
        assert got.cores == (usable[0],)
        assert os.sched_getaffinity(0) == {usable[0]}
    finally:
        go.set()
        before.join()
        monkeypatch.setenv(PIN_ENV, "0")
        back = pinning.pin_rank(0, 2, 1)
    assert seen == {"before": set(usable), "after": {usable[0]}}
    assert back.cores is None and os.sched_getaffinity(0) == set(usable)


def test_pinning_is_opt_in(monkeypatch) -> None:
    """Unset, ranks are not pinned (measured noisier beside load); 1 pins, 0 does not."""
    from labkit.rank.pinning import pin_enabled

    monkeypatch.delenv(PIN_ENV, raising=False)
    assert not pin_enabled()
    monkeypatch.setenv(PIN_ENV, "1")
    assert pin_enabled()
    monkeypatch.setenv(PIN_ENV, "0")
    assert not pin_enabled()
