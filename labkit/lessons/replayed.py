"""The quantity a timed verdict judged, read again on the dedicated-core replay (issue 32).

A lesson's verdict judges one quantity -- "Ray Train's step / labkit's", "TP's slowdown
across the link / the pipeline's", "ASP / BSP gradients per second". When the verdict is not
"holds", the lesson replays the runs behind that quantity on dedicated cores
(``labkit.lessons.dedicated``: each compute span at its CPU time, each message at what it took
in the run's median step) and says the *same* quantity again, computed by the same function
from the replayed timelines, beside the figure of one replayed run. The sentence and the
figure then read one quantity, and the student sees what the algorithm does with a core per
rank next to what the busy machine did to it.

``replayed(result)``: a stand-in for ``result`` whose timeline is the replay (every other
attribute is the run's own), so a lesson's own reading of a run (``step_parts``,
``gradient_rate``, ``step_time_s``) applies unchanged; None where the run cannot be replayed.
``intended_idle``: a straggler's idle is part of the experiment, not a wait for a core; the
replay keeps it as (factor - 1) x the straggler's own CPU time. ``again``: the sentence.
Torch-free.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from labkit.analysis.replay import MODEL_LABEL
from labkit.analysis.timeline import Timeline
from labkit.base.events import Lane

IDLE = re.compile(r"slow x(?P<factor>[0-9.]+)$")
"""The name of a straggler's idle span (``labkit.strategies.ps.worker``: "slow x4")."""


def intended_idle(timeline: Timeline) -> Timeline:
    """``timeline`` with every straggler idle span ("slow xF", a sleep: no CPU time) given the
    CPU cost it stands for: (F - 1) x the CPU time of the rank's other compute in that step.
    The replay then keeps the slowdown the experiment asked for and drops only the waiting
    for a core (a sleep stretched by the machine's load, or cut short, is not the algorithm)."""
    cpu: dict[tuple[int, int | None], int] = {}
    for e in timeline:
        if e.lane is Lane.COMPUTE and e.cpu_ns is not None and not IDLE.match(e.name or ""):
            cpu[(e.rank, e.step)] = cpu.get((e.rank, e.step), 0) + e.cpu_ns
    events = []
    for e in timeline:
        hit = IDLE.match(e.name or "") if e.lane is Lane.COMPUTE else None
        if hit is not None:
            want = int((float(hit["factor"]) - 1) * cpu.get((e.rank, e.step), 0))
            e = dataclasses.replace(e, cpu_ns=want, dur_ns=max(e.dur_ns, want))
        events.append(e)
    return Timeline(events, timeline.world_size, dict(timeline.meta))


@dataclasses.dataclass(frozen=True)
class _Replayed:
    """A run with its timeline replaced by its replay; every other attribute is the run's."""

    run: Any
    timeline: Timeline

    def __getattr__(self, name: str) -> Any:
        return getattr(self.run, name)

    @property
    def step_time_s(self) -> float:
        return self.timeline.median_step_s()


def replayed(result: Any) -> Any | None:
    """``result`` on dedicated cores (``labkit.lessons.dedicated.dedicated``, the straggler's
    intended idle kept), as an object a lesson's readers take in place of the run; None where
    the trace cannot be replayed (no CPU times, a collective without its members)."""
    from labkit.lessons.dedicated import dedicated

    kept = _DONE.get(id(result))
    if kept is not None and kept[0] is result:  # a lesson reads one run several times
        return kept[1]
    rep = dedicated(intended_idle(result.timeline))
    copy = None if rep is None else _Replayed(result, rep.timeline)
    _DONE[id(result)] = (result, copy)
    return copy


_DONE: dict[int, tuple[Any, Any]] = {}
"""This kernel's replays, by the run's id (the run is kept, so its id stays its own)."""


def again(what: str, read: Callable[..., float], runs: Sequence[Any], measured: float,
          fmt: str = ".2f") -> str:
    """One sentence: ``read(*runs)`` (the verdict's own quantity) on the replayed runs,
    labelled as a model, beside what this machine measured; or why there is no replay."""
    copies = [replayed(r) for r in runs]
    if any(c is None for c in copies):
        return (f"{what}: no dedicated-core replay (a run's trace has no CPU times, or a "
                f"collective whose members it does not name)")
    try:
        value = read(*copies)
    except (ValueError, ZeroDivisionError) as err:
        return f"{what}: the replayed runs cannot give it ({err})"
    return f"{what}, {MODEL_LABEL}: {value:{fmt}}, where this machine measured {measured:{fmt}}"


def delay(result: Any) -> float | None:
    """How much longer ``result``'s median step was on this machine than on its replay
    (measured / replayed); None where it cannot be replayed."""
    copy = replayed(result)
    if copy is None or copy.step_time_s <= 0:
        return None
    return float(result.timeline.median_step_s() / copy.step_time_s)


def most_delayed(runs: Mapping[str, Any]) -> str | None:
    """The name of the run the machine's load stretched most (``delay``), among those that can
    be replayed: the one whose replay a lesson draws beside its verdict."""
    delays = {name: d for name, r in runs.items() if (d := delay(r)) is not None}
    return max(delays, key=lambda n: delays[n]) if delays else None


def draw_if_missed(runs: Mapping[str, Any], said: str, *, label: str) -> Any:
    """Where ``said`` (the verdicts a cell printed) holds one that is not "holds": the most
    delayed of ``runs`` beside its dedicated-core replay, one figure
    (``labkit.lessons.dedicated.replay_if_missed``, recorded in its ``SHOWN`` as
    "``label``: the run's name"); else it says every verdict held and returns None."""
    from labkit.lessons.dedicated import missed, replay_if_missed

    name = most_delayed(runs) if missed(said) else None
    if name is None and not runs:
        return replay_if_missed([], said, what=f"{label}: no run")
    if name is None:
        return replay_if_missed(next(iter(runs.values())), said, what=f"{label}: no run")
    return replay_if_missed(intended_idle(runs[name].timeline), said,
                            what=f"{label}: {name}'s step")
