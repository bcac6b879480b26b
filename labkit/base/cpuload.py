"""How much of the machine *other* programs used: the CPU time every process used, less this
process tree's, over a stretch of wall clock.

The 1-minute load average cannot say it: it counts runnable processes, ours included, and
decays over a minute, so right after a lesson's two ranks finish on a quiet 2-core laptop it
reads 1.5 and a lesson would blame "other programs" for its own ranks. Here:

* everyone's CPU is the machine's busy time (``psutil.cpu_times``: all but idle and iowait;
  guest time is already inside user time on Linux, so it is not added twice);
* ours is this process and every descendant alive now, each with the CPU of the children it
  has reaped (``cpu_times().children_*``): a rank that finished and was waited for still
  counts, in its parent;
* others = (everyone's - ours) / wall, in cores' worth.

A process that died unreaped between two samples is lost (a zombie's CPU shows only once
reaped), which can only make others look busier. Torch-free, no processes started.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import psutil


def cpu_count() -> int:
    """Cores this process may run on (respects taskset / cgroup affinity); torch-free, so
    ``labkit.theory`` counts them too (``labkit.base.devices`` re-exports it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class CpuSample:
    """One reading: CPU seconds since boot of every process and of ours, and when."""

    everyone_s: float
    ours_s: float
    at_s: float  # time.monotonic()


def _busy_s() -> float:
    t = psutil.cpu_times()
    idle = t.idle + getattr(t, "iowait", 0.0)
    guest = getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)
    return sum(t) - idle - guest


def _used_s(p: psutil.Process, children: bool) -> float:
    t = p.cpu_times()
    return t.user + t.system + ((t.children_user + t.children_system) if children else 0.0)


def cpu_sample(tree: bool = True) -> CpuSample:
    """Read the machine's busy time and ours: this process alone (``tree=False``: a
    measurement that runs in this process's threads), or this process, its reaped children
    and every descendant alive now (a lesson's ranks, a warm pool, Ray's daemons)."""
    me = psutil.Process()
    ours = _used_s(me, tree)
    if tree:
        for child in me.children(recursive=True):
            try:
                ours += _used_s(child, True)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue  # gone since the listing: its CPU is in its parent's now
    return CpuSample(_busy_s(), ours, time.monotonic())


def others_cores(before: CpuSample, after: CpuSample) -> float:
    """Cores' worth of CPU that processes outside ours used between two samples."""
    wall = max(after.at_s - before.at_s, 1e-9)
    return max(0.0, ((after.everyone_s - before.everyone_s)
                     - (after.ours_s - before.ours_s)) / wall)


def others_now(window_s: float = 0.5) -> float:
    """Cores' worth of CPU other programs use now, read over ``window_s`` seconds (our own
    tree keeps running meanwhile and is taken out)."""
    before = cpu_sample()
    time.sleep(window_s)
    return others_cores(before, cpu_sample())


def busy_limit(cores: int) -> float:
    """Cores' worth of other programs' CPU past which a timing here is not a quiet one: a
    quarter of a core, or 15 % of the machine (0.3 of 2 cores) (a browser tab, an editor and a
    terminal stay under it; a video call or one CPU hog does not). Calibration and the
    lessons' sentences share it."""
    return max(0.25, 0.15 * cores)
