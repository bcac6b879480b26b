"""Ranks pinned to cores: the measurement protocol's "one rank per core where the cores allow"
(issue 32, item 1).

Two ranks on two cores still move: the kernel's scheduler may run both on one core for a
while, or migrate a rank and leave its cache behind, and a step that waited for a core reads
as a slow step. Pinning each rank to cores of its own (``os.sched_setaffinity``, as
``taskset`` and torchrun's ``--numa-binding`` do) takes that source of spread out, so a timed
claim reads the algorithm, not the scheduler.

The rule, decided in each rank from what the machine lets it use:

1. the usable cores are the rank process's affinity set as it started (taskset, a cgroup's
   cpuset, Ray's or a container's limits all show there), read once per process, so a warm
   pool rank that pinned itself for one job still knows the whole set for the next;
2. when ``world_size`` ranks fit on them, rank ``r`` takes the ``r``-th block of
   ``k = min(threads, cores // world_size)`` cores (one core each when the ranks fill the
   machine; a rank's torch threads keep their cores when there are spare ones);
3. when they do not fit (more ranks than cores), for a run of one rank (no peer to keep
   apart: pinned, every lone run on a machine -- two test workers, a student's two notebooks
   -- would crowd core 0), or ``LABKIT_PIN_RANKS=0``, no rank is pinned and every rank gets
   the whole usable set back; the reason is recorded.

Pinning is opt-in (``LABKIT_PIN_RANKS=1``, ``pin_enabled``): measured beside load, pinned
ranks were noisier, not steadier, since a pinned rank cannot leave a core another program
took.

Global rank and world size, never the local rank: ranks that share a host (emulated nodes in
namespaces, torchrun's agents) then never share a core, and ranks on hosts of their own stay
within the cores each host allows. The rank's main thread is pinned (it computes; the
intra-op threads it starts later inherit its cores); gloo's threads, started with the process
group, stay free to run wherever a core is idle: pinned beside the compute they made naive
DDP's step slower here (measured: ``bench/bench_pinning.py``, docs/benchmarks.md). Linux only;
elsewhere nothing is pinned, and the record says why. Torch-free.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PIN_ENV = "LABKIT_PIN_RANKS"
"""Set to 1 to pin (``pin_enabled``: opt-in); read by each rank per job (a warm
``labkit.Pool`` reads the environment it was started with)."""

_USABLE: tuple[int, ...] | None = None


@dataclass(kw_only=True, frozen=True)
class Pinning:
    """Where one rank ran: its cores, or why it was not pinned."""

    cores: tuple[int, ...] | None
    """The cores this rank was pinned to (None: not pinned, it ran on every usable core)."""
    usable: int
    """How many cores the rank's affinity set allowed before pinning."""
    reason: str
    """Why it was pinned or not, in words a lesson can print."""


def usable_cores() -> tuple[int, ...]:
    """The cores this process may run on, as it started (step 1; empty where unknown)."""
    global _USABLE
    if _USABLE is None:
        getter = getattr(os, "sched_getaffinity", None)
        _USABLE = tuple(sorted(getter(0))) if getter is not None else ()
    return _USABLE


def plan(rank: int, world_size: int, threads: int, usable: tuple[int, ...], *,
         enabled: bool = True) -> Pinning:
    """Step 2-3 as pure data: the cores ``rank`` takes, or why it takes none."""
    n = len(usable)
    if not enabled:
        return Pinning(cores=None, usable=n, reason=f"not pinned ({PIN_ENV}=1 pins)")
    if n == 0:
        return Pinning(cores=None, usable=0,
                       reason="not pinned: this system cannot set a process's cores")
    if world_size == 1:  # no peer to keep apart; pinned, every lone run would crowd core 0
        return Pinning(cores=None, usable=n, reason="not pinned: one rank, no peer to keep apart")
    if world_size > n:
        return Pinning(cores=None, usable=n,
                       reason=f"not pinned: {world_size} ranks share {n} usable cores")
    k = max(1, min(threads, n // world_size))
    cores = usable[rank * k:(rank + 1) * k]
    return Pinning(cores=cores, usable=n,
                   reason=f"pinned: {world_size} ranks on {n} usable cores, "
                          f"{k} core{'s' if k > 1 else ''} each")


def pin_enabled() -> bool:
    """Opt-in (``LABKIT_PIN_RANKS=1``): measured beside load, pinned ranks were noisier, not
    steadier -- a pinned rank cannot leave a core another program took (bucketed DDP's
    spread over runs 0.82 pinned against 0.22 unpinned, 1F1B's 1.14 against 0.18; load 7-9,
    ``bench/bench_pinning.py``) -- and a student's laptop is rarely quiet. On a quiet
    machine the gain is not measured yet; until it is, the scheduler keeps its freedom."""
    return os.environ.get(PIN_ENV, "0").strip().lower() in ("1", "true", "yes", "on")


def pin_rank(rank: int, world_size: int, threads: int) -> Pinning:
    """Pin this rank's main thread by the rule (or unpin it) and say what was done."""
    usable = usable_cores()
    chosen = plan(rank, world_size, threads, usable, enabled=pin_enabled())
    if usable:
        try:
            _set_main_thread(chosen.cores if chosen.cores is not None else usable)
        except OSError as err:  # the set shrank under us (a cgroup changed): run unpinned
            return Pinning(cores=None, usable=len(usable), reason=f"not pinned: {err}")
    return chosen


def _set_main_thread(cores: tuple[int, ...]) -> None:
    """``sched_setaffinity`` of the calling thread only (Linux sets one thread's cores): the
    rank's main thread, which computes; threads it starts later (the intra-op pool) inherit
    the set. Threads that exist already -- gloo's, which move the messages -- keep floating:
    pinned beside the compute on one core they queued behind it for a scheduler slice, and
    naive DDP's step got slower (docs/benchmarks.md, "Ranks pinned to cores")."""
    os.sched_setaffinity(0, cores)


def run_meta(pinnings: list[Pinning | None]) -> dict[str, object]:
    """What a run's timeline meta says of its ranks' cores (``meta["pinning"]``): whether
    every rank was pinned, each rank's cores (None: not pinned) and one sentence."""
    known = [p for p in pinnings if p is not None]
    every = bool(known) and len(known) == len(pinnings) and all(p.cores is not None
                                                               for p in known)
    reasons = sorted({p.reason for p in known})
    return {"pinned": every,
            "cores": [list(p.cores) if p is not None and p.cores is not None else None
                      for p in pinnings],
            "reason": "; ".join(reasons) if reasons else "not recorded by this launcher"}
