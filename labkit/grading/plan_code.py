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
real ranks and must match the single-process reference.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from typing import Any

from labkit import theory
from labkit.grading.checks import NotANumber, Verdict, as_number
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

VISIBLE_CASES = ((2, 4), (4, 8))
HIDDEN_CASES = ((3, 5), (4, 4), (2, 1), (5, 7), (4, 12))


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
            if type(a) is str:
                parsed.append(Action.parse(a))
            elif type(a) is Action:
                parsed.append(Action(int(a.stage), Op(a.op), int(a.microbatch)))
            else:
                raise TypeError(f"rank {key}: {a!r} is not an action string like '0F0'")
        orders[int(rank)] = parsed
    return orders


def executor_available() -> bool:
    """True once ``labkit.strategies.pipeline.executor`` exists (written for lesson 03)."""
    try:
        return importlib.util.find_spec("labkit.strategies.pipeline.executor") is not None
    except ModuleNotFoundError:
        return False


def check_plan_case(fn: Callable[..., Any], stages: int, microbatches: int) -> Verdict:
    """Validate and simulate the student's plan for one (stages, microbatches)."""
    where = f"one_f_one_b(stages={stages}, microbatches={microbatches})"
    try:
        answer = fn(stages, microbatches)
    except NotImplementedError:
        return Verdict(False, "one_f_one_b is not implemented yet: replace `raise "
                       "NotImplementedError` with your code.")
    except Exception as exc:  # noqa: BLE001 (any failure of student code is feedback)
        return Verdict(False, f"{where} raised {type(exc).__name__}: {exc}")
    try:
        orders = _orders(answer, stages)
        plan: Plan = plan_from_orders(orders, stages=stages, microbatches=microbatches,
                                      schedule="student-1f1b")
        validate_plan(plan)
    except (ScheduleError, TypeError, ValueError) as exc:
        return Verdict(False, f"{where} is not a valid schedule:\n{exc}\nTry: on rank r run "
                       f"min(stages - r, microbatches) forwards (warm-up), then alternate one "
                       "backward and one forward (steady state), then the remaining backwards.")
    for rank in range(stages):
        peak = peak_in_flight(plan, rank)
        if peak > stages - rank:
            return Verdict(False, f"{where}: rank {rank} holds {peak} microbatches' activations "
                           f"at once; 1F1B holds at most stages - rank = {stages - rank}. That "
                           "is GPipe's memory cost: start backwards as soon as the warm-up "
                           "forwards are done.")
    bubble = planned_bubble_fraction(plan, {Op.F: 1.0, Op.B: 1.0})
    want = theory.bubble_fraction(stages, microbatches, "1f1b", relative_to="total")
    if abs(bubble - want) > 1e-9:
        return Verdict(False, f"{where}: simulated bubble {bubble:.3f} of the step, but 1F1B "
                       f"idles (p-1)/(m+p-1) = {want:.3f}. Some rank waits longer than it must: "
                       "check the order of its warm-up and cool-down.")
    return Verdict(True, f"{where}: valid, 1F1B memory, bubble {bubble:.3f} = (p-1)/(m+p-1).")


def run_on_executor(fn: Callable[..., Any], stages: int = 2, microbatches: int = 4,
                    tolerance: float = 1e-5) -> Verdict:
    """Run the student's plan with the pipeline executor on ``stages`` real ranks."""
    from labkit.config import ModelConfig
    from labkit.strategies.pipeline.executor import run_plan

    where = f"one_f_one_b(stages={stages}, microbatches={microbatches})"
    plan = plan_from_orders(_orders(fn(stages, microbatches), stages), stages=stages,
                            microbatches=microbatches, schedule="student-1f1b")
    try:
        result = run_plan(plan, steps=1, model=ModelConfig(width=64, depth=2 * stages),
                          check_reference=True, timeout_s=60.0)
    except Exception as exc:  # noqa: BLE001 (any failure of student code is feedback)
        return Verdict(False, f"{where} failed on the pipeline executor: {exc}")
    diff = max(float(result.metrics.get("max_abs_diff_grads", float("inf"))),
               float(result.metrics.get("max_abs_diff_loss", 0.0)))
    if not diff <= tolerance:
        return Verdict(False, f"{where} ran, but its gradients differ from one process on the "
                       f"whole batch by {diff:.3g} (allowed {tolerance:g}).")
    return Verdict(True, f"{where} ran on {stages} real ranks; gradients match one process "
                   f"(max abs diff {diff:.2g}).")


def check_one_f_one_b(fn: Callable[..., Any], cases: Sequence[tuple[int, int]] = VISIBLE_CASES,
                      execute: bool = False) -> Verdict:
    """Every case valid; with ``execute`` the first case also runs on the executor."""
    for stages, microbatches in cases:
        verdict = check_plan_case(fn, stages, microbatches)
        if not verdict.passed:
            return verdict
    note = ""
    if execute and executor_available():
        ran = run_on_executor(fn, *cases[0])
        if not ran.passed:
            return ran
        note = " " + ran.feedback
    elif execute:
        note = (" (validated and simulated only: the pipeline executor is not installed in "
                "this labkit, so it was not run on ranks)")
    return Verdict(True, f"one_f_one_b: valid 1F1B plans for {list(cases)}.{note}")
