"""Problem set 6, instructor side: the hidden cases and the rules that grade them.

Q1 (``may_read``): compared with labkit's own SSP gate (``labkit.strategies.ps.protocol.Gate``
with every worker's clock set as the case says; Ho et al. 2013: read at clock c only while
the slowest worker is at c - s or later) on the visible cases and on 60 random ones.
Q2 (``straggler_effects``): the lesson's formulas, ``((W - 1) F + 1) / W`` and
``(W - 1) F`` (``labkit.lessons.async_ps.straggler_predictions``), within 1%.
Q3 (``serializations``): counted by ``count`` below on visible and hidden programs.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from labkit.grading import calls
from labkit.grading.async_ps import (
    FORBID,
    GATE_PARTS,
    SEED_GATE_CASES,
    SEED_PROGRAMS,
    SEED_STRAGGLERS,
    read_bool,
    read_count,
    read_effects,
)
from labkit.grading.parts import Question
from labkit.strategies.ps.protocol import Consistency, Gate

HIDDEN_STRAGGLERS = [(4, 3.0), (8, 1.0), (5, 2.5), (16, 1.5)]
HIDDEN_PROGRAMS: dict[str, list[Any]] = {
    "64 tasks by value, then 4 by reference": [
        ("loop", 64, [("task_value",)]), ("put",), ("loop", 4, [("task_ref",)])],
    "one put reused by nested loops": [
        ("put",), ("loop", 3, [("loop", 10, [("task_ref",)])])],
    "a put per epoch, 8 tasks each": [("loop", 5, [("put",), ("loop", 8, [("task_ref",)])])],
    "mixed: value inside, reference outside": [
        ("put",), ("loop", 4, [("task_ref",), ("task_value",)]), ("task_value",)],
}


def expected_gate(clock: int, clocks: Sequence[int], staleness: int) -> bool:
    """labkit's SSP gate with the workers at ``clocks``, asked by a worker at ``clock``."""
    gate = Gate(Consistency.SSP, workers=len(clocks), bound=staleness)
    gate.clocks = list(clocks)
    return gate.may_read(step=clock)


def hidden_gate_cases(n: int = 60, seed: int = 6) -> list[tuple[int, list[int], int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        staleness = rng.randint(0, 4)
        clocks = [rng.randint(0, 30) for _ in range(rng.randint(1, 6))]
        out.append((rng.choice(clocks), clocks, staleness))
    return out


def _gate_part(staleness: int, allowed: bool) -> str:
    if staleness == 0:
        return GATE_PARTS[2]
    return GATE_PARTS[0] if allowed else GATE_PARTS[1]


def check_gate(q: Question, fn: Any) -> None:
    for clock, clocks, staleness in [*SEED_GATE_CASES, *hidden_gate_cases()]:
        want = expected_gate(clock, clocks, staleness)
        part = _gate_part(staleness, want)
        label = f"clock {clock}, clocks {list(clocks)}, s = {staleness}"
        got = calls.answer(q, part, fn, (clock, list(clocks), staleness), forbid=FORBID,
                           reader=read_bool, where=label)
        if got is None:
            continue
        slowest = min(clocks)
        q.record(part, got == want,
                 f"{label}: the gate says {want}. The slowest worker is at clock {slowest}, "
                 f"this one at {clock}: {clock - slowest} clock(s) ahead, and SSP lets a "
                 f"worker read only while it is at most s = {staleness} ahead")


def check_stragglers(q: Question, fn: Any) -> None:
    for workers, factor in [*SEED_STRAGGLERS, *HIDDEN_STRAGGLERS]:
        label = f"{workers} workers, one {factor:g}x slower"
        got = calls.answer(q, "ASP / BSP gradients per second", fn, (workers, factor),
                           forbid=FORBID, reader=read_effects, where=label)
        if got is None:
            continue
        rate, stale = ((workers - 1) * factor + 1) / workers, (workers - 1) * factor
        q.record("ASP / BSP gradients per second",
                 abs(got["asp_over_bsp_rate"] - rate) <= 0.01 * rate,
                 f"{label}: expected {rate:.3g}, got {got['asp_over_bsp_rate']:.3g}. BSP moves "
                 "at the straggler's pace; ASP takes every gradient as it comes")
        q.record("ASP's largest staleness",
                 abs(got["asp_max_staleness"] - stale) <= 0.01 * max(stale, 1),
                 f"{label}: expected {stale:.3g}, got {got['asp_max_staleness']:.3g}. Count "
                 "what the fast workers push while the straggler computes one gradient")


def count(program: Sequence[Any]) -> int:
    """Serializations of the payload: one per put and per task given the value itself."""
    total = 0
    for step in program:
        if step[0] == "loop":
            total += step[1] * count(step[2])
        elif step[0] in ("put", "task_value"):
            total += 1
    return total


def _program_part(program: Sequence[Any]) -> str:
    def kinds(steps: Sequence[Any], inside: bool) -> set[str]:
        out: set[str] = set()
        for s in steps:
            if s[0] == "loop":
                out |= kinds(s[2], True)
            elif s[0] == "put" and inside:
                out.add("a put inside a loop")
            elif s[0] == "task_value":
                out.add("by value")
        return out

    found = kinds(program, False)
    if "a put inside a loop" in found:
        return "a put inside a loop"
    return "by value" if "by value" in found else "by reference"


def check_programs(q: Question, fn: Any) -> None:
    for label, program in {**SEED_PROGRAMS, **HIDDEN_PROGRAMS}.items():
        part = _program_part(program)
        got = calls.answer(q, part, fn, (list(program),), forbid=FORBID, reader=read_count,
                           where=label)
        if got is None:
            continue
        want = count(program)
        q.record(part, got == want,
                 f"{label}: the payload is serialized {want} times, not {got}. Every "
                 "ray.put serializes it once; a task given the object itself serializes it "
                 "again; a task given a reference serializes only the small reference")
