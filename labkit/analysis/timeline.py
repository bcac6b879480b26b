"""All ranks' spans of one run, merged on one clock, with the analysis lessons need.

Definitions used throughout the lessons (and by ``RunResult.metrics``):

* **compute time / comm time** of a rank: length of the *union* of its compute (comm) spans,
  so nested or concurrent spans are not counted twice.
* **overlap fraction**: the share of comm time that is hidden under compute, i.e.
  ``|comm ∩ compute| / |comm|``, averaged over ranks. 0 means every byte was moved while the
  rank computed nothing; 1 means communication was completely hidden.
* **idle (bubble) fraction**: the share of a window (default: first to last step span of the
  rank) in which the rank did no compute. For pipelines this is the measured bubble.
"""

from __future__ import annotations

import itertools
import json
import statistics
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.base.events import ABORTED, SCHEMA_VERSION, Event, Lane, Op
from labkit.base.files import write_atomic
from labkit.base.grid import Grid

Interval = tuple[int, int]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Merge overlapping [start, end) intervals; the result is sorted and disjoint."""
    merged: list[Interval] = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            if e > merged[-1][1]:
                merged[-1] = (merged[-1][0], e)
        else:
            merged.append((s, e))
    return merged


def total(intervals: Iterable[Interval]) -> int:
    return sum(e - s for s, e in union(intervals))


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Intersection of two *disjoint sorted* interval lists."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _steady_median(times: list[float], skip_first: bool) -> float:
    """The median of ``times``, the first (warm-up) left out where there are more."""
    if skip_first and len(times) > 1:
        times = times[1:]
    return statistics.median(times) if times else 0.0


@dataclass
class Timeline:
    """Every rank's events on one clock (ns since the aligned start of the run)."""

    events: list[Event]
    world_size: int
    meta: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    # ---- selection -------------------------------------------------------------------
    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    @property
    def ranks(self) -> list[int]:
        return list(range(self.world_size))

    def select(self, *, rank: int | None = None, lane: Lane | None = None, op: Op | None = None,
               step: int | None = None, steps: Iterable[int] | None = None) -> list[Event]:
        """Events matching every given filter, in start order."""
        wanted = set(steps) if steps is not None else None
        return [e for e in self.events
                if (rank is None or e.rank == rank) and (lane is None or e.lane == lane)
                and (op is None or e.op == op) and (step is None or e.step == step)
                and (wanted is None or e.step in wanted)]

    def rank_labels(self) -> list[str]:
        """"rank 3" or, on a grid with several axes, "rank 3 dp0 pp1 tp1"."""
        grid = self.meta.get("grid") or {}
        active = [a for a in ("dp", "pp", "cp", "tp", "ep") if grid.get(a, 1) > 1]
        if len(active) < 2:
            return [f"rank {r}" for r in self.ranks]
        g = Grid(**{a: int(grid.get(a, 1)) for a in ("dp", "pp", "tp", "cp", "ep")})
        return [f"rank {r} " + " ".join(f"{a}{g.coords(r)[a]}" for a in active)
                for r in self.ranks]

    def steps(self) -> list[int]:
        return sorted({e.step for e in self.events if e.op == Op.STEP and e.step is not None})

    def finished_steps(self, rank: int) -> list[int]:
        """The steps ``rank`` completed: in a failed run's ``err.timeline`` the step it died
        in is missing, and a step it left by an exception is marked ``ABORTED``."""
        return sorted(e.step for e in self.events if e.rank == rank and e.op == Op.STEP
                      and e.name != ABORTED and e.step is not None)

    def window(self, steps: Iterable[int] | None = None) -> Timeline:
        """A timeline holding only the given steps (default: all but the first, the warm-up)."""
        all_steps = self.steps()
        chosen = set(steps) if steps is not None else set(all_steps[1:] or all_steps)
        return Timeline([e for e in self.events if e.step in chosen], self.world_size,
                        dict(self.meta), self.schema_version)

    def _intervals(self, rank: int, lane: Lane) -> list[Interval]:
        return union((e.start_ns, e.end_ns) for e in self.events
                     if e.rank == rank and e.lane == lane)

    # ---- per-rank analysis -----------------------------------------------------------
    def compute_ns(self, rank: int) -> int:
        return total(self._intervals(rank, Lane.COMPUTE))

    def comm_ns(self, rank: int) -> int:
        return total(self._intervals(rank, Lane.COMM))

    def overlap_ns(self, rank: int) -> int:
        """Comm time during which the same rank was also computing."""
        return total(intersect(self._intervals(rank, Lane.COMM),
                               self._intervals(rank, Lane.COMPUTE)))

    def span_ns(self, rank: int) -> int:
        """From the rank's first step start to its last step end (or first/last event)."""
        steps = [e for e in self.events if e.rank == rank and e.lane == Lane.STEP]
        evs = steps or [e for e in self.events if e.rank == rank]
        if not evs:
            return 0
        return max(e.end_ns for e in evs) - min(e.start_ns for e in evs)

    def idle_fraction(self, rank: int) -> float:
        """Share of the rank's span with no compute running (the measured bubble)."""
        span = self.span_ns(rank)
        return 0.0 if span == 0 else 1.0 - self.compute_ns(rank) / span

    # ---- run-level summaries -----------------------------------------------------------
    def compute_s(self) -> float:
        """Mean over ranks of compute time, seconds."""
        return statistics.fmean(self.compute_ns(r) for r in self.ranks) / 1e9

    def comm_s(self) -> float:
        """Mean over ranks of communication time, seconds."""
        return statistics.fmean(self.comm_ns(r) for r in self.ranks) / 1e9

    def overlap_fraction(self) -> float:
        """Share of comm time hidden under compute, averaged over ranks that communicate."""
        shares = [self.overlap_ns(r) / c for r in self.ranks if (c := self.comm_ns(r)) > 0]
        return statistics.fmean(shares) if shares else 0.0

    def bubble_fraction(self) -> float:
        """Mean over ranks of the idle share of each rank's span."""
        return statistics.fmean(self.idle_fraction(r) for r in self.ranks)

    def bytes_sent(self, rank: int, ops: Iterable[Op] | None = None) -> int:
        """Bytes this rank put on the wire (recv spans count nothing: they are received)."""
        chosen = set(ops) if ops is not None else None
        return sum(e.bytes or 0 for e in self.events
                   if e.rank == rank and e.lane == Lane.COMM and e.op != Op.RECV
                   and (chosen is None or e.op in chosen))

    def _step_bounds(self) -> list[tuple[int, int]]:
        """Per step, in order: (earliest rank's start, latest rank's end), ns; one pass."""
        bounds: dict[int, tuple[int, int]] = {}
        for e in self.events:
            if e.op == Op.STEP and e.step is not None:
                lo, hi = bounds.get(e.step, (e.start_ns, e.end_ns))
                bounds[e.step] = (min(lo, e.start_ns), max(hi, e.end_ns))
        return [bounds[s] for s in sorted(bounds)]

    def step_times_s(self) -> list[float]:
        """Per step: from the earliest rank's start to the latest rank's end, seconds."""
        return [(end - start) / 1e9 for start, end in self._step_bounds()]

    def median_step_s(self, skip_first: bool = True) -> float:
        return _steady_median(self.step_times_s(), skip_first)

    def step_periods_s(self) -> list[float]:
        """Per step after the first: from the previous step's end to this one's, a step
        ending when its slowest rank ends it, seconds: the time a step adds to the run,
        which throughput (tokens per second) divides by. Where ranks run skewed (a
        pipeline's last stage starts its next step while the first still ends this one),
        ``step_times_s``'s span from the earliest start is longer by that skew."""
        ends = [end for _, end in self._step_bounds()]
        return [(b - a) / 1e9 for a, b in itertools.pairwise(ends)]

    def median_step_period_s(self, skip_first: bool = True) -> float:
        """Median of ``step_periods_s`` (the first period, after warm-up's step, skipped)."""
        return _steady_median(self.step_periods_s(), skip_first)

    def summary(self) -> dict[str, float]:
        """The headline numbers of a run (steady-state window: the first step is skipped)."""
        w = self.window()
        return {"compute_s": w.compute_s(), "comm_s": w.comm_s(),
                "overlap_fraction": w.overlap_fraction(), "idle_fraction": w.bubble_fraction(),
                "step_time_s": self.median_step_s()}

    # ---- persistence -----------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "world_size": self.world_size,
                "meta": self.meta, "events": [e.to_json() for e in self.events]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Timeline:
        from labkit.base.errors import LabError

        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            raise LabError(f"timeline schema_version {version!r} is not supported; this labkit "
                           f"reads version {SCHEMA_VERSION}")
        return cls([Event.from_json(e) for e in d["events"]], int(d["world_size"]),
                   dict(d.get("meta", {})), version)

    def save(self, path: str | Path) -> Path:
        """Write the timeline JSON all at once (``write_atomic``: never a half or empty file)."""
        return write_atomic(path, json.dumps(self.to_json()))

    @classmethod
    def load(cls, path: str | Path) -> Timeline:
        return cls.from_json(json.loads(Path(path).read_text()))

    def to_chrome(self, path: str | Path | None = None) -> dict[str, Any]:
        """Chrome / Perfetto trace JSON (see ``labkit.analysis.chrome``); written to ``path`` if given."""
        from labkit.analysis.chrome import to_chrome_trace

        trace = to_chrome_trace(self.events, self.rank_labels(), self.meta, self.schema_version)
        if path is not None:
            write_atomic(path, json.dumps(trace, indent=1))  # a full disk leaves no 0-byte file
        return trace
