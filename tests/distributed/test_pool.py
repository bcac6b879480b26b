"""The warm pool (``labkit.Pool``): reruns equal a fresh run bit for bit, failures rebuild
it, grid sub-groups are made once, progress shows, and no rank outlives the pool -- not
even when the process that held it is killed with SIGKILL."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

import labkit
from labkit.base.errors import RunFailed, RunTimeout
from labkit.config.run import ModelConfig
from labkit.launchers import runner
from labkit.rank.context import inject_fault

pytestmark = [pytest.mark.distributed, pytest.mark.lesson01]

RUN = {"strategy": "ddp-bucketed", "world_size": 2, "steps": 3, "progress": False,
       "model": ModelConfig(width=128, depth=3), "options": {"bucket_cap_mb": 0.02},
       "timeout_s": 120}


def test_pool_reruns_equal_a_fresh_run_bit_for_bit(contained: Any) -> None:
    """Two calls on one pool and a fresh ``labkit.run``: same params_sha256, same losses,
    the ranks started once, and each call's timeline on its own clock (it starts at 0 and
    ends within the call, not seconds later where the first call left the clock)."""
    fresh = labkit.run(**RUN)
    with labkit.Pool(2) as pool:
        first = pool.run(**RUN)
        second = pool.run(**RUN)
        assert pool.starts == 1 and pool.warm
        out = pool.launch(lambda ctx, k: ctx.rank * k, 10)
    assert pool.closed and not pool.warm
    assert first.params_sha256 == second.params_sha256 == fresh.params_sha256 is not None
    assert first.losses == second.losses == fresh.losses
    assert first.metrics["buckets"] == fresh.metrics["buckets"] > 1
    for r in (first, second):
        starts = [e.start_ns for e in r.timeline.events]
        assert min(starts) >= 0 and max(e.end_ns for e in r.timeline.events) < r.wall_s * 1e9
    assert out.results == [0, 10] and len(out.logs) == 2


def _fail(ctx: Any, kind: str) -> int:
    if ctx.rank == 1:
        inject_fault(kind, 0)
    return ctx.rank


def test_failed_jobs_are_reported_like_fresh_runs_and_the_pool_is_rebuilt(contained: Any
                                                                         ) -> None:
    """An exception, an exit, a kill and a hang each fail the call exactly as labkit.launch
    reports it (rank, kind, message), tear the ranks down, and the next call works on new
    ranks. Calls that pass after a failure start the ranks again once."""
    with pytest.raises(RunFailed) as fresh:
        labkit.launch(_fail, 2, "exit")
    with labkit.Pool(2) as pool:
        assert pool.launch(_fail, "none").results == [0, 1]
        seen = {}
        for kind, timeout in (("raise", 60), ("exit", 60), ("kill", 60), ("hang", 3)):
            with pytest.raises(RunFailed) as err:
                pool.launch(_fail, kind, timeout_s=timeout)
            seen[kind] = err.value
            assert not pool.warm, f"{kind}: the failed ranks were not torn down"
            assert pool.launch(_fail, "none").results == [0, 1], f"no rebuild after {kind}"
        assert pool.starts == 5
    assert (seen["exit"].rank, seen["exit"].kind) == (fresh.value.rank, fresh.value.kind)
    assert str(seen["exit"]).splitlines()[0] == str(fresh.value).splitlines()[0]
    assert seen["raise"].kind == "exception" and "injected fault" in str(seen["raise"])
    assert seen["kill"].kind == "signal" and "SIGKILL" in str(seen["kill"])
    assert isinstance(seen["hang"], RunTimeout)


class _Bar:
    """Stands in for tqdm: records the progress a run reports, can stop it like Ctrl-C."""

    def __init__(self, total: int, stop_after: int | None):
        self.total, self.n, self.updates, self.stop_after = total, 0, 0, stop_after

    def update(self, k: int) -> None:
        self.n += k
        self.updates += 1
        if self.stop_after is not None and self.updates > self.stop_after:
            raise KeyboardInterrupt

    def refresh(self) -> None:  # the runner's ticker redraws it from a thread
        pass

    def close(self) -> None:
        pass


def test_progress_shows_and_the_stop_button_leaves_no_rank(contained: Any,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """A pool run drives the same progress bar as labkit.run, to every step of every rank;
    Ctrl-C (the notebook's stop button, raised here from the bar) tears the ranks down and
    the next call starts new ones."""
    bars: list[_Bar] = []

    def bar(total: int, enabled: bool | None, desc: str) -> _Bar | None:
        if not enabled:
            return None
        bars.append(_Bar(total, stop_after=None if len(bars) == 0 else 3))
        return bars[-1]

    monkeypatch.setattr(runner, "_progress_bar", bar)
    with labkit.Pool(2) as pool:
        pool.run(**{**RUN, "progress": True})
        assert bars[0].n == bars[0].total == RUN["steps"] * 2
        with pytest.raises(KeyboardInterrupt):
            pool.run(**{**RUN, "steps": 100_000, "progress": True})
        assert not pool.warm and contained.processes() == []
        assert pool.run(**RUN).params_sha256 is not None and pool.starts == 2


def _group_count(ctx: Any) -> int:
    from torch.distributed import distributed_c10d

    return len(distributed_c10d._world.pg_map)


def test_grid_subgroups_are_made_once_per_grid(contained: Any) -> None:
    """A run on a dp x pp grid makes its axis groups on the first call only: the second
    call reuses them (same number of process groups) and trains the same model."""
    hybrid = {"strategy": "hybrid", "world_size": 4, "steps": 1, "progress": False,
              "model": ModelConfig(width=32, depth=2), "options": {"pp": 2},
              "timeout_s": 180}
    with labkit.Pool(4) as pool:
        before = pool.launch(_group_count).results
        first = pool.run(**hybrid)
        made = pool.launch(_group_count).results
        second = pool.run(**hybrid)
        after = pool.launch(_group_count).results
    assert made == after and made[0] > before[0]
    assert first.losses == second.losses and first.losses


_HOLDER = r"""
import sys, time, labkit
pool = labkit.Pool(2)
pool.launch(lambda ctx: ctx.rank)
print(" ".join(str(p.pid) for p in pool._sup.procs), flush=True)
if sys.argv[1] == "busy":
    pool.launch(lambda ctx: time.sleep(120), timeout_s=300)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.parametrize("moment", ["idle", "busy"])
def test_ranks_die_when_the_kernel_is_killed(moment: str, contained: Any) -> None:
    """A process holding a pool (a notebook kernel) is SIGKILLed, between jobs or in the
    middle of one: its ranks are gone within seconds (no orphans)."""
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, moment], stdout=subprocess.PIPE,
                              text=True)
    try:
        line = holder.stdout.readline() if holder.stdout else ""
        ranks = [int(p) for p in line.split()]
        assert len(ranks) == 2, f"the holder printed {line!r}"
        time.sleep(0.5)  # "busy": the ranks are inside the sleeping job now
        assert all(_alive(p) for p in ranks)
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(30)
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in ranks) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in ranks if _alive(p)], f"ranks outlived the killed kernel ({moment})"
    # a SIGKILLed process cleans nothing up: its pool's files stay until the OS clears tmp
    for leftover in contained.temp_entries():
        shutil.rmtree(contained.tmpdir / leftover, ignore_errors=True)
