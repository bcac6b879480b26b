"""What each lesson's own run must show, checked in the lesson's kernel after its last cell.

``tests/notebooks/test_notebooks.py`` executes a lesson, then runs ``check(NAME, globals())``
in the same kernel: the checks read the very objects the cells printed and plotted, so they
pin what the student saw. They assert the *phenomenon* each lesson teaches, with a margin
(a ratio, an order, a split), never a time. A check fails with the measured numbers.

Phenomena made of timings (a bubble, an overlap, a speedup, a race) are held to their margin
on a quiet machine. On a busy one (other programs -- the tests' other worker, two CPU hogs, a
student's video call -- used more than ``busy_limit``, 0.3 of 2 cores, while the lesson ran
or as it is checked: ``labkit.base.cpuload``, the lesson's own ranks never counted) a timing
may miss its margin: then the check asks that the lesson said so in its own words where it
prints a verdict (``labkit.lessons.machine.why_not``) -- a lesson may be slow or noisy, never
silently wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.notebooks.claims.early import lesson_00, lesson_01, lesson_02, lesson_03, lesson_04
from tests.notebooks.claims.late import lesson_10, lesson_11, lesson_12, lesson_13, lesson_14
from tests.notebooks.claims.middle import lesson_05, lesson_06, lesson_07, lesson_09
from tests.notebooks.claims.verdicts import SAID, judged, timed

__all__ = ["CHECKS", "SAID", "check", "judged", "timed"]


CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "00_welcome": lesson_00, "03_pipeline_parallelism": lesson_03,
    "04_tensor_parallelism": lesson_04, "05_memory_and_zero": lesson_05,
    "06_communication": lesson_06,
    "01_data_parallelism": lesson_01, "02_batch_size_and_lr": lesson_02,
    "07_fault_tolerance": lesson_07, "09_3d_parallelism": lesson_09,
    "10_multi_node": lesson_10, "11_async_training": lesson_11, "12_ray": lesson_12,
    "13_laptop_to_cluster": lesson_13,
    "14_long_sequences_and_experts": lesson_14,
}


def check(stem: str, ns: dict[str, Any], others: float | None = None) -> str:
    """Run the lesson's check, if it has one; returns what was checked (for the output).
    ``others``: cores' worth of CPU that programs outside the lesson's tree used while its
    cells ran (the harness reads it; ``verdicts.timed`` calls the run quiet only if that and
    a reading now both are)."""
    from tests.notebooks.claims import verdicts
    from tests.notebooks.teaching import break_mechanisms

    verdicts.DURING[:] = [] if others is None else [others]
    verdicts.READ.clear()
    verdicts.QUIET_MISSES.clear()
    verdicts.LESSON[:] = [stem]
    fn = CHECKS.get(stem)
    if fn is not None:
        fn(ns)
    assert not verdicts.QUIET_MISSES, (f"{len(verdicts.QUIET_MISSES)} timed claim(s) of {stem} "
                                       "missed on a quiet machine:\n"
                                       + "\n".join(verdicts.QUIET_MISSES))
    said = " | ".join(filter(None, [fn.__doc__.split(chr(10))[0] if fn and fn.__doc__ else
                                  ("checked" if fn else "no claims to check"),
                                  break_mechanisms(stem, ns)]))
    return f"{stem}: {said}"
