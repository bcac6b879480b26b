"""Lesson 00's sentences: what the first two runs showed about compute and communication.

The welcome lesson says that on a small model communication, not computation, takes most of
a data-parallel step (the story of the later lessons, seed 003), and that four ranks on a
machine with fewer cores stay correct while their timings include waiting for a core. Both
are read here from the runs: compute and exposed communication per step (over the steps past
warm-up, mean over ranks: ``dp_lesson.step_split_ms``) and the difference from one process.

Which steps are past warm-up is read from the run too (``settled_steps``): the first one or
two steps pay one-off costs (allocations, first calls, gloo's first connection), often 5-20x
a later step's compute, so a lesson draws and averages the steps whose compute lies near the
run's median. And what "equal to one process" can mean in fp32 (``float32_step``): two
runs that sum the same numbers in another order end a float step or so apart. Torch-free.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from labkit.base.devices import cpu_count
from labkit.lessons.dp_lesson import step_split_ms
from labkit.lessons.machine import load_now, why_not
from labkit.theory.rounding import run_tolerance


def welcome_text(*runs: Any) -> str:
    """Per run: compute and exposed communication per step, which of the two took longer,
    and whether the ranks ended with one process's weights."""
    lines = []
    for r in runs:
        n = r.config.world_size
        part = step_split_ms(r, settled_steps(r.timeline, count=None))
        comp, comm = part["compute_ms"], part["exposed_ms"]
        line = (f"{n} ranks: compute {comp:.1f} ms, communication not hidden {comm:.1f} ms "
                f"per step")
        if comm > comp:
            line += f": communication took {comm / max(comp, 1e-9):.1f}x the compute"
        else:
            line += (": compute took longer here -- " + why_not(load_now(), n)
                     if n > cpu_count() else ": compute took longer on this machine (fast "
                     "memory copies between ranks, or a slow core)")
        diff = r.metrics.get("max_abs_diff_vs_reference")
        if diff is not None:
            tol = run_tolerance(r.config)
            line += (f"; weights equal one process's up to {diff:.0e} (rounding reaches "
                     f"{tol:.0e}: labkit.theory.rounding)" if diff < tol
                     else f"; weights differ from one process's by {diff:.1g}, more than "
                     f"rounding's {tol:.0e}: report this run")
        lines.append(line)
    return "\n".join(lines)


SETTLED = 1.5
"""A step is past warm-up when its compute (mean over ranks) is at most this many times the
median step's: warm-up steps sit at 4-20x, settled ones within about 1.3x of each other."""


def step_compute_ms(timeline: Any) -> dict[int, float]:
    """Per step: compute (forward, backward, optimizer), mean over ranks, ms."""
    out = {}
    for s in timeline.steps():
        w = timeline.window([s])
        ranks = w.ranks or [0]
        out[s] = sum(w.compute_ns(r) for r in ranks) / len(ranks) / 1e6
    return out


def settled_steps(timeline: Any, count: int | None = 2, margin: float = SETTLED) -> list[int]:
    """The first ``count`` consecutive steps (all of them when ``count`` is None) whose compute
    is within ``margin`` x the median step's; step 0 only when no other step qualifies."""
    compute = step_compute_ms(timeline)
    steps = sorted(compute)
    if len(steps) < 2:
        return steps
    median = statistics.median(compute[s] for s in steps[1:])
    ok = [s for s in steps[1:] if compute[s] <= margin * median]
    if count is None:
        return ok or steps[1:]
    runs = [ok[i:i + count] for i in range(len(ok))
            if ok[i:i + count] == list(range(ok[i], ok[i] + count))]
    return runs[0] if runs else (ok or steps[1:])[:count]


def steps_text(timeline: Any, shown: list[int]) -> str:
    """Which steps ran slow (compute beyond ``SETTLED`` x the median step's): before the first
    settled step that is warm-up, after it a busy moment; and which steps are drawn."""
    compute = step_compute_ms(timeline)
    later = [compute[s] for s in sorted(compute)[1:]] or list(compute.values())
    median = statistics.median(later)
    slow = [s for s in sorted(compute) if compute[s] > SETTLED * median]
    first = min((s for s in compute if s not in slow), default=0)

    def listed(steps: list[int], why: str) -> list[str]:
        return [", ".join(f"step {s} {compute[s]:.2f} ms ({compute[s] / median:.0f}x)"
                          for s in steps) + f" {why}"] if steps else []

    parts = (listed([s for s in slow if s < first], "paid warm-up")
             + listed([s for s in slow if s > first], "ran slow (a busy moment)"))
    drawn = ", ".join(f"step {s} {compute[s]:.2f} ms" for s in shown)
    return (f"compute per step (mean over ranks): median {median:.2f} ms, "
            + ("; ".join(parts) if parts else "no step paid warm-up") + f"; drawn: {drawn}")


def float32_step(x: float) -> float:
    """The gap between ``|x|`` and the next larger fp32 number (one unit in the last place):
    2**(e - 23) for 2**e <= |x| < 2**(e+1). Weights near ``x`` can only differ by multiples."""
    if not math.isfinite(x) or x == 0:
        raise ValueError(f"x ({x}) must be a finite non-zero number, e.g. 0.18")
    return 2.0 ** (math.floor(math.log2(abs(x))) - 23)


def rounding_gap(config: Any) -> float:
    """Predicted |w - one process| of a data-parallel MLP run: one fp32 step at its largest
    weights. torch's ``nn.Linear`` draws weights from U(-1/sqrt(fan_in), 1/sqrt(fan_in)), so
    the largest sit just under 1/sqrt(in_dim) (the first layer's fan-in is the smallest);
    a run that sums its gradients in another order rounds such a weight to a neighbouring
    float now and then (``labkit.theory.rounding``: about lr x the gradient's rounding per
    step, far below one float step, so a gap of one step)."""
    fan_in = min(config.model.in_dim, config.model.width)
    return float32_step(0.999 / math.sqrt(fan_in))
