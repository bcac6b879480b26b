"""Problem set 6, instructor side: the hidden cases, drawn per student, and the rules.

Q1 (``may_read``): compared with labkit's own SSP gate (``labkit.strategies.ps.protocol.Gate``
with every worker's clock set as the case says; Ho et al. 2013: read at clock c only while
the slowest worker is at c - s or later) on the visible cases and on 60 random ones.
Q2 (``straggler_effects``): the lesson's formulas, ``((W - 1) F + 1) / W`` and
``(W - 1) F`` (``labkit.lessons.async_ps.straggler_predictions``), within 1%.
Q3 (``serializations``): counted by ``count`` below on visible and hidden programs.

Every hidden case is drawn from a generator seeded with ``SECRET`` and the student's id
(autograding passes it as ``student_id``), and the feedback of a hidden case names its
inputs and the rule, never the expected answer: one classmate's feedback fills no table.
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

SECRET = "ps6-hidden-2e8d"


def _rng(student: str, what: str) -> random.Random:
    return random.Random(f"{SECRET}:{what}:{student}")


def hidden_stragglers(student: str) -> list[tuple[int, float]]:
    """(workers, slowdown) x 4: one straggler no slower than the rest, three slower."""
    rng = _rng(student, "stragglers")
    return [(rng.randint(3, 16), 1.0)] + [
        (rng.randint(2, 32), round(rng.uniform(1.2, 4.0), 1)) for _ in range(3)]


def _program(rng: random.Random, kind: str, depth: int = 0) -> list[Any]:
    """A small Ray program whose counting rule is ``kind`` (see ``_program_part``)."""
    loop = rng.randint(2, 12)
    if kind == "a put inside a loop":
        inner = [("put",), *[("task_ref",)] * rng.randint(1, 3)]
        return [("loop", loop, inner), *(_program(rng, "by value", 1) if depth == 0 and
                                         rng.random() < 0.5 else [])]
    if kind == "by value":
        return [("put",), ("loop", loop, [("task_value",), ("task_ref",)][:rng.randint(1, 2)]),
                ("task_value",)] if rng.random() < 0.5 else [("loop", loop, [("task_value",)])]
    nested = ("loop", rng.randint(2, 5), [("loop", loop, [("task_ref",)])])
    return [("put",), nested if rng.random() < 0.5 else ("loop", loop, [("task_ref",)])]


def hidden_programs(student: str) -> dict[str, list[Any]]:
    """Four programs: a put inside a loop, tasks by value, by reference, and one more."""
    rng = _rng(student, "programs")
    kinds = ["a put inside a loop", "by value", "by reference", rng.choice(
        ["a put inside a loop", "by value", "by reference"])]
    return {f"hidden program {i + 1}": _program(rng, kind) for i, kind in enumerate(kinds)}


def expected_gate(clock: int, clocks: Sequence[int], staleness: int) -> bool:
    """labkit's SSP gate with the workers at ``clocks``, asked by a worker at ``clock``."""
    gate = Gate(Consistency.SSP, workers=len(clocks), bound=staleness)
    gate.clocks = list(clocks)
    return gate.may_read(step=clock)


def hidden_gate_cases(student: str, n: int = 60) -> list[tuple[int, list[int], int]]:
    rng = _rng(student, "gate")
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


def check_gate(q: Question, fn: Any, student: str = "") -> None:
    hidden = hidden_gate_cases(student)
    for i, (clock, clocks, staleness) in enumerate([*SEED_GATE_CASES, *hidden]):
        want = expected_gate(clock, clocks, staleness)
        part = _gate_part(staleness, want)
        label = f"clock {clock}, clocks {list(clocks)}, s = {staleness}" \
            if i < len(SEED_GATE_CASES) else f"hidden case {i - len(SEED_GATE_CASES) + 1}"
        got = calls.answer(q, part, fn, (clock, list(clocks), staleness), forbid=FORBID,
                           reader=read_bool, where=label)
        if got is None:
            continue
        if i >= len(SEED_GATE_CASES):  # a yes/no case: its inputs and "wrong" would tell
            q.record(part, got == want, f"hidden case {i - len(SEED_GATE_CASES) + 1} of "
                     f"{len(hidden)} (drawn for you) disagrees with SSP: a worker may read "
                     "only while it is at most s clocks ahead of the slowest worker")
            continue
        slowest = min(clocks)
        q.record(part, got == want,
                 f"{label}: the gate says {want}. The slowest worker is at clock {slowest}, "
                 f"this one at {clock}: {clock - slowest} clock(s) ahead, and SSP lets a "
                 f"worker read only while it is at most s = {staleness} ahead")


def check_stragglers(q: Question, fn: Any, student: str = "") -> None:
    for workers, factor in [*SEED_STRAGGLERS, *hidden_stragglers(student)]:
        label = f"{workers} workers, one {factor:g}x slower"
        got = calls.answer(q, "ASP / BSP gradients per second", fn, (workers, factor),
                           forbid=FORBID, reader=read_effects, where=label)
        if got is None:
            continue
        rate, stale = ((workers - 1) * factor + 1) / workers, (workers - 1) * factor
        seen = (workers, factor) in SEED_STRAGGLERS
        q.record("ASP / BSP gradients per second",
                 abs(got["asp_over_bsp_rate"] - rate) <= 0.01 * rate,
                 f"{label}: " + (f"expected {rate:.3g}, " if seen else "") +
                 f"got {got['asp_over_bsp_rate']:.3g}. BSP moves at the straggler's pace; "
                 "ASP takes every gradient as it comes")
        q.record("ASP's largest staleness",
                 abs(got["asp_max_staleness"] - stale) <= 0.01 * max(stale, 1),
                 f"{label}: " + (f"expected {stale:.3g}, " if seen else "") +
                 f"got {got['asp_max_staleness']:.3g}. Count what the fast workers push "
                 "while the straggler computes one gradient")


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


def check_programs(q: Question, fn: Any, student: str = "") -> None:
    for label, program in {**SEED_PROGRAMS, **hidden_programs(student)}.items():
        part = _program_part(program)
        got = calls.answer(q, part, fn, (list(program),), forbid=FORBID, reader=read_count,
                           where=label)
        if got is None:
            continue
        want = count(program)
        said = f"is serialized {want} times, not {got}" if label in SEED_PROGRAMS else \
            f"is not serialized {got} times (hidden: {program})"
        q.record(part, got == want,
                 f"{label}: the payload {said}. Every ray.put serializes it once; a task "
                 "given the object itself serializes it again; a task given a reference "
                 "serializes only the small reference")
