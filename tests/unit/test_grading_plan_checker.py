"""The plan checker accepts every feasible plan and explains why an infeasible one fails."""

from __future__ import annotations

import pytest

from labkit import theory
from labkit.grading.plan_checker import SCENARIOS, all_plans, check_plan

pytestmark = pytest.mark.lesson08


def independent_feasible(plan: dict, sc) -> bool:  # type: ignore[no-untyped-def]
    """The rules written out again from labkit.theory, to cross-check the checker."""
    act = sc.activation_gb * (sc.checkpoint_factor if plan["checkpointing"] else 1) / plan["tp"]
    states = theory.zero_memory(sc.params / (plan["tp"] * plan["pp"]), plan["dp"],
                                plan["zero_stage"])["total"]
    fits = states + act * 1e9 <= sc.gpu_gb * 1e9
    bubble_ok = plan["pp"] == 1 or theory.bubble_fraction(
        plan["pp"], plan["microbatches"], "1f1b") <= sc.max_bubble
    return fits and bubble_ok and sc.gpus_per_node % plan["tp"] == 0


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_checker_agrees_with_the_rules_on_every_plan(name: str) -> None:
    sc = SCENARIOS[name]
    feasible = 0
    for plan in all_plans(sc):
        report = check_plan(plan, sc)
        assert report.feasible == independent_feasible(plan, sc), (plan, report.reasons)
        assert report.feasible == (not report.reasons)
        feasible += report.feasible
    assert feasible > 3  # many answers are right


def test_seed_options_a_and_b_are_accepted() -> None:
    """Seed 000: A = DP + ZeRO-2 + checkpointing; B = 2-way PP x 2-way DP + ZeRO-1."""
    a = dict(tp=1, pp=1, dp=4, zero_stage=2, checkpointing=True)
    b = dict(tp=1, pp=2, dp=2, zero_stage=1, microbatches=8)
    assert check_plan(a, "seed_3b_4x24gb").feasible
    assert check_plan(b, "seed_3b_4x24gb").feasible


def test_pure_dp_fails_on_memory_with_the_numbers() -> None:
    report = check_plan(dict(tp=1, pp=1, dp=4, zero_stage=0), "seed_3b_4x24gb")
    assert not report.feasible
    assert "Memory" in report.reasons[0] and "54.0 GB" in report.reasons[0]  # 48 states + 6 act
    assert "ZeRO" in report.reasons[0]


def test_tp_across_nodes_and_big_bubble_are_explained() -> None:
    plan = dict(tp=16, pp=2, dp=1, zero_stage=0, checkpointing=True, microbatches=1)
    reasons = " ".join(check_plan(plan, "seed_320gb_multinode").reasons)
    assert "does not fit inside a node of 8 GPUs" in reasons
    assert "infiniband_hdr" in reasons
    assert "Bubble" in reasons and "microbatches" in reasons


def test_malformed_and_cheating_plans_are_rejected() -> None:
    class AlwaysEqual:
        def __eq__(self, other: object) -> bool:
            return True

    assert not check_plan({"tp": AlwaysEqual(), "pp": 1, "dp": 4}, "seed_3b_4x24gb").feasible
    assert not check_plan({"tp": 1, "pp": 1, "dp": 3}, "seed_3b_4x24gb").feasible
    assert not check_plan("dp=4", "seed_3b_4x24gb").feasible  # type: ignore[arg-type]
    assert "unknown key" in check_plan({"dp": 4, "zero": 3}, "seed_3b_4x24gb").reasons[-1]
