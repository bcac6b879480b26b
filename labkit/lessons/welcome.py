"""Lesson 00's sentences: what the first two runs showed about compute and communication.

The welcome lesson says that on a small model communication, not computation, takes most of
a data-parallel step (the story of the later lessons, seed 003), and that four ranks on a
machine with fewer cores stay correct while their timings include waiting for a core. Both
are read here from the runs: compute and exposed communication per step (first step
skipped, mean over ranks: ``dp_lesson.step_split_ms``) and the difference from one process.
Torch-free.
"""

from __future__ import annotations

from typing import Any

from labkit.base.devices import cpu_count
from labkit.lessons.dp_lesson import step_split_ms
from labkit.lessons.machine import load_now, why_not
from labkit.theory.rounding import same_weights_tolerance


def welcome_text(*runs: Any) -> str:
    """Per run: compute and exposed communication per step, which of the two took longer,
    and whether the ranks ended with one process's weights."""
    lines = []
    for r in runs:
        n = r.config.world_size
        part = step_split_ms(r)
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
            c = r.config
            tol = same_weights_tolerance(c.optimizer, c.lr, c.steps)
            line += (f"; weights equal one process's up to {diff:.0e} (rounding reaches "
                     f"{tol:.0e}: labkit.theory.rounding)" if diff < tol
                     else f"; weights differ from one process's by {diff:.1g}, more than "
                     f"rounding's {tol:.0e}: report this run")
        lines.append(line)
    return "\n".join(lines)
