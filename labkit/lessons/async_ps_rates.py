"""Lesson 11's rates, read from a parameter-server run's trace (torch-free).

Every gradient is a ``push`` that server 0 received from the worker that computed it, so the
trace says, per worker, when each of its gradients arrived:

* ``gradient_rate``: gradients per second while every worker was still pushing (under ASP
  the fast worker finishes first and the straggler then runs alone; a whole-run rate would
  end at the straggler's pace under every consistency model);
* ``realized_factor``: how many times longer the straggler's step really was than a fast
  worker's, while both ran;
* ``straggler_staleness``: the typical staleness of the straggler's gradients meanwhile,
  from server 0's log of applied gradients.
"""

from __future__ import annotations

import statistics
from typing import Any

from labkit.base.events import Op


def _arrivals(result: Any) -> dict[int, list[int]]:
    """Worker rank -> when server 0 had each of its gradients (ns, in order), from the trace:
    every gradient is a ``push`` server 0 received from the worker that computed it."""
    arrived: dict[tuple[int, int], int] = {}
    for e in result.timeline.select(rank=0, op=Op.RECV):
        if e.name == "push" and e.peer is not None and e.step is not None:
            arrived[(e.peer, e.step)] = max(arrived.get((e.peer, e.step), 0), e.end_ns)
    out: dict[int, list[int]] = {}
    for (worker, _), t in sorted(arrived.items()):
        out.setdefault(worker, []).append(t)
    return {w: sorted(ts) for w, ts in out.items()}


def _window(result: Any, arrivals: dict[int, list[int]]) -> tuple[int, int]:
    """From the first pull to the last gradient of the first worker to finish."""
    servers = result.config.options.servers
    pulls = [e.start_ns for e in result.timeline.events if e.rank >= servers
             and e.name == "pull"]
    return min(pulls, default=0), min((ts[-1] for ts in arrivals.values() if ts), default=0)


def gradient_rate(result: Any) -> dict[str, float]:
    """Gradients server 0 received per second while every worker was still pushing.

    The window opens at the first pull and closes when the first worker to finish pushed its
    last gradient (under BSP all finish together; under ASP the fast worker finishes first,
    after which the straggler runs alone).
    """
    arrivals = _arrivals(result)
    start, end = _window(result, arrivals)
    n = sum(1 for ts in arrivals.values() for t in ts if t <= end)
    window = (end - start) / 1e9
    return {"rate": n / window if window > 0 else 0.0, "gradients": n, "window_s": window}


def realized_factor(exp: Any) -> float:
    """How many times longer the straggler's step really was than a fast worker's, in the
    ASP run with the straggler while both ran: the median time between two of its gradients
    over the fast workers' (first gradients skipped: they pay for warm-up).

    The factor asked for is ``exp.settings["factor"]``; the straggler idles (F - 1) x its own
    compute, and its compute slows when it shares a core with the others, while messages
    lengthen every step: so the two differ, and the formulas are worth reading with both.
    """
    res = exp.runs.get("asp, straggler")
    slow = exp.settings["straggler_rank"]
    if res is None:
        return float(exp.settings["factor"])
    arrivals = _arrivals(res)
    _, end = _window(res, arrivals)
    gaps: dict[int, list[int]] = {}
    for w, ts in arrivals.items():
        inside = [t for t in ts if t <= end]
        gaps[w] = [b - a for a, b in zip(inside[1:], inside[2:])]
    fast = [g for w, v in gaps.items() if w != slow for g in v]
    if not fast or not gaps.get(slow):
        return float(exp.settings["factor"])
    return statistics.median(gaps[slow]) / statistics.median(fast)


def straggler_staleness(exp: Any) -> float | None:
    """The typical staleness of the straggler's gradients while the fast workers still ran
    (median, its first gradient skipped), read from server 0's log of applied gradients;
    None where the run did not bring that log back."""
    res = exp.runs.get("asp, straggler")
    records = [o.record for o in getattr(res, "outputs", []) or []]
    log = next((r for r in records if getattr(r, "role", None) == "server"
                and getattr(r, "server", None) == 0), None)
    if res is None or log is None or not log.grad_staleness:
        return None
    slow = exp.settings["straggler_rank"] - res.config.options.servers
    fast_left = len([w for w in log.grad_worker if w != slow])
    mine: list[int] = []
    for stale, worker in zip(log.grad_staleness, log.grad_worker):
        if worker != slow:
            fast_left -= 1
        elif fast_left > 0:
            mine.append(stale)
    return float(statistics.median(mine[1:])) if len(mine) > 1 else None
