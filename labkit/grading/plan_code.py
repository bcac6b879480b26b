"""Grade a student's hand-written 1F1B pipeline plan (problem set 3, last exercise).

The student writes ``one_f_one_b(stages, microbatches) -> {rank: ["0F0", "0F1", "0B0", ...]}``:
each rank's actions in order, in the ``2F0`` notation of ``labkit.schedules`` (stage 2,
forward, microbatch 0). The grader converts the answer to plain ``Action`` objects, lays
it out with ``plan_from_orders`` (which rejects orders that deadlock) and runs
``validate_plan`` (every forward before its backward, every stage after the previous one,
each (stage, microbatch) exactly once). Then it checks what makes it 1F1B rather than
GPipe (Narayanan et al. 2021, PipeDream-Flush): rank r never holds more than ``stages - r``
microbatches' activations at once, and the simulated bubble equals the theory's
``(p-1)/(m+p-1)``. Finally, where the pipeline executor is available, the plan is run on
real ranks and must match the single-process reference. Each is a part of its own.

The student's function must build the plan itself: a call into ``labkit.schedules``
(``build_plan("1f1b")`` returns exactly this plan) or ``labkit.theory`` while it runs
fails the gate, with a message. The hidden cases live on the instructor's side
(``solutions/_grading/ps3_build_it.py``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from typing import Any

from labkit import theory
from labkit.grading import calls
from labkit.grading.checks import NotANumber, Verdict, as_number
from labkit.grading.parts import Question
from labkit.schedules import (
    Action,
    Plan,
    ScheduleError,
    peak_in_flight,
    plan_from_orders,
    planned_bubble_fraction,
    validate_plan,
)
from labkit.schedules.actions import Op
from labkit.strategies.pipeline import pipeline_model

VISIBLE_CASES = ((2, 4), (4, 8))
FORBID = ("labkit.schedules", "labkit.theory", "labkit.grading", "labkit.strategies")
VALID, MEMORY, BUBBLE, RUNS = ("a valid schedule", "1F1B memory: rank r holds at most p - r",
                               "bubble (p-1)/(m+p-1)", "runs on real ranks")
OWN = "your own plan (not labkit's)"


def _orders(answer: object, stages: int) -> dict[int, list[Action]]:
    """The student's dict as plain {int: [Action]}; raises TypeError/ValueError with advice."""
    if not isinstance(answer, dict):
        raise TypeError(f"return a dict {{rank: [action strings]}}, got {type(answer).__name__}")
    orders: dict[int, list[Action]] = {}
    for key, actions in answer.items():
        try:
            rank = as_number(key, "rank")
        except NotANumber as exc:
            raise TypeError(str(exc)) from None
        if rank != int(rank) or not 0 <= rank < stages:
            raise ValueError(f"rank {key!r} must be 0..{stages - 1}")
        if not isinstance(actions, (list, tuple)):
            raise TypeError(f"rank {key}: the actions must be a list of strings like '0F0'")
        parsed = []
        for a in actions:
            if type(a) is not str:
                raise TypeError(f"rank {key}: {a!r} is not an action string like '0F0'")
            parsed.append(Action.parse(a))
        orders[int(rank)] = parsed
    return orders


def executor_available() -> bool:
    """True once ``labkit.strategies.pipeline.executor`` exists (written for lesson 03)."""
    try:
        return importlib.util.find_spec("labkit.strategies.pipeline.executor") is not None
    except ModuleNotFoundError:
        return False


def question(points: float = 3) -> Question:
    return Question("one_f_one_b", points, [VALID, MEMORY, BUBBLE])


def add_case(q: Question, fn: Callable[..., Any], stages: int, microbatches: int) -> Plan | None:
    """Validate and simulate the student's plan for one (stages, microbatches)."""
    where = f"one_f_one_b(stages={stages}, microbatches={microbatches})"
    try:
        outcome = calls.call(fn, (stages, microbatches), {}, FORBID)
    except NotImplementedError:
        q.record(VALID, False, "one_f_one_b is not implemented yet: replace `raise "
                 "NotImplementedError` with your code.")
        return None
    except Exception as exc:  # noqa: BLE001 (any failure of student code is feedback)
        q.record(VALID, False, f"{where} raised {exc}")
        return None
    if outcome.used or outcome.tampered:
        q.forbidden(OWN, outcome.used, outcome.tampered, gate=True)
        return None
    q.record(OWN, True, gate=True)
    try:
        plan: Plan = plan_from_orders(_orders(outcome.value, stages), stages=stages,
                                      microbatches=microbatches, schedule="student-1f1b")
        validate_plan(plan)
    except (ScheduleError, TypeError, ValueError) as exc:
        q.record(VALID, False, f"{where} is not a valid schedule:\n{exc}\nTry: on rank r run "
                 "min(stages - r, microbatches) forwards (warm-up), then alternate one "
                 "backward and one forward (steady state), then the remaining backwards.")
        return None
    q.record(VALID, True)
    worst = max(range(stages), key=lambda r: peak_in_flight(plan, r) - (stages - r))
    peak = peak_in_flight(plan, worst)
    q.record(MEMORY, peak <= stages - worst,
             f"{where}: rank {worst} holds {peak} microbatches' activations at once; 1F1B "
             f"holds at most stages - rank = {stages - worst}. That is GPipe's memory cost: "
             "start backwards as soon as the warm-up forwards are done.")
    bubble = planned_bubble_fraction(plan, {Op.F: 1.0, Op.B: 1.0})
    want = theory.bubble_fraction(stages, microbatches, "1f1b", relative_to="total")
    q.record(BUBBLE, abs(bubble - want) <= 1e-9,
             f"{where}: simulated bubble {bubble:.3f} of the step, but 1F1B idles "
             f"(p-1)/(m+p-1) = {want:.3f}. Some rank waits longer than it must: check the "
             "order of its warm-up and cool-down.")
    return plan


def run_on_executor(plan: Plan, tolerance: float = 1e-5) -> Verdict:
    """Run a (validated) plan with the pipeline executor on real ranks, in this process.

    The plan is plain data (action strings from the student's function), so the grader
    runs it itself: no student code is involved.
    """
    from labkit.lessons.pipeline import run_plan

    stages, microbatches = plan.stages, plan.microbatches
    where = f"one_f_one_b(stages={stages}, microbatches={microbatches})"
    try:
        result = run_plan(plan, steps=1, model=pipeline_model(64, 2 * stages),
                          check_reference=True, timeout_s=60.0)
    except Exception as exc:  # noqa: BLE001 (a failing plan is feedback)
        return Verdict(False, f"{where} failed on the pipeline executor: {exc}")
    diff = max(float(result.metrics.get("max_abs_diff_grads", float("inf"))),
               float(result.metrics.get("max_abs_diff_loss", 0.0)))
    if not diff <= tolerance:
        return Verdict(False, f"{where} ran, but its gradients differ from one process on the "
                       f"whole batch by {diff:.3g} (allowed {tolerance:g}).")
    return Verdict(True, f"{where} ran on {stages} real ranks; gradients match one process "
                   f"(max abs diff {diff:.2g}).")


def add_cases(q: Question, fn: Callable[..., Any],
              cases: Sequence[tuple[int, int]] = VISIBLE_CASES, execute: bool = False) -> None:
    """Every case validated and simulated; with ``execute`` the first also runs on ranks."""
    plans = [add_case(q, fn, stages, microbatches) for stages, microbatches in cases]
    if execute and executor_available() and plans and plans[0] is not None:
        q.record(RUNS, run_on_executor(plans[0]))
