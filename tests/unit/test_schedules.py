"""Pipeline schedules as data: actions, builders and plan tables (no processes)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from labkit.base.errors import ConfigError, LabError
from labkit.schedules import (
    Action,
    Op,
    ScheduleError,
    build_plan,
    check_plan,
    format_plan,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    plan_from_orders,
    validate_plan,
    zero_bubble,
)

pytestmark = pytest.mark.lesson03

CASES = [(s, p, m, v)
         for s, v in (("gpipe", 1), ("1f1b", 1), ("zb", 1), ("interleaved", 2))
         for p in (2, 4) for m in range(1, 17)
         if s != "interleaved" or m % p == 0]


# --- actions ---------------------------------------------------------------------------

def test_action_prints_as_stage_op_microbatch() -> None:
    """str(Action) is the compact PyTorch-style name: stage, op letter, microbatch."""
    assert str(Action(2, Op.F, 0)) == "2F0"
    assert str(Action(11, Op.W, 15)) == "11W15"


@pytest.mark.parametrize("a", [Action(s, op, m) for s in (0, 3, 12) for op in Op
                               for m in (0, 7, 15)])
def test_action_parse_round_trips(a: Action) -> None:
    """Action.parse is the inverse of str for every op and multi-digit numbers."""
    assert Action.parse(str(a)) == a


@pytest.mark.parametrize("text", ["", "F0", "2X0", "2F", "-1F0", "2 F 0 x", "2f0"])
def test_action_parse_rejects_garbage_naming_the_string(text: str) -> None:
    """A malformed action string raises ConfigError that quotes it and shows an example."""
    with pytest.raises(ConfigError) as err:
        Action.parse(text)
    assert repr(text) in str(err.value) and "2F0" in str(err.value)


def test_action_is_hashable_and_frozen() -> None:
    """Actions are values: usable as dict keys, immutable."""
    a = Action(1, Op.B, 2)
    assert {a: 1}[Action(1, Op.B, 2)] == 1
    with pytest.raises(AttributeError):
        a.stage = 3  # type: ignore[misc]


def test_import_does_not_pull_in_torch() -> None:
    """labkit.schedules is pure Python, so importing it is instant and torch-free."""
    code = "import sys, labkit.schedules; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# --- builders ----------------------------------------------------------------------------

@pytest.mark.parametrize("schedule,p,m,v", CASES)
def test_every_built_plan_is_valid(schedule: str, p: int, m: int, v: int) -> None:
    """Every schedule x P in {2,4} x M in 1..16 (interleaved where M % P == 0) validates."""
    plan = build_plan(schedule, p, m, v)
    assert check_plan(plan) == []
    validate_plan(plan)
    assert (plan.schedule, plan.stages, plan.microbatches, plan.virtual) == (schedule, p, m, v)
    assert sorted(plan.order) == list(range(p))
    assert len({len(slots) for slots in plan.order.values()}) == 1  # rows equally long


@pytest.mark.parametrize("schedule,p,m,v", CASES)
def test_ranks_only_run_stages_they_own(schedule: str, p: int, m: int, v: int) -> None:
    """plan.actions(rank) only holds stages with stage_to_rank(stage) == rank."""
    plan = build_plan(schedule, p, m, v)
    for rank in range(p):
        assert all(plan.stage_to_rank(a.stage) == rank for a in plan.actions(rank))


def test_gpipe_table_is_two_staircases() -> None:
    """GPipe in unit slots: rank r forwards in slots r..r+m-1, backwards after all forwards."""
    plan = gpipe(3, 4)
    for rank in range(3):
        slots = plan.order[rank]
        assert [slots[rank + i] for i in range(4)] == [Action(rank, Op.F, i) for i in range(4)]
        assert [a.op for a in plan.actions(rank)] == [Op.F] * 4 + [Op.B] * 4
    # last rank turns around immediately: its first B is right after its last F
    assert plan.order[2][6] == Action(2, Op.B, 0)
    assert plan.order[1][7] == Action(1, Op.B, 0)


def test_one_f_one_b_has_warmup_steady_cooldown() -> None:
    """1F1B rank r: p-r-1 warmup forwards, then alternating F/B, then the remaining Bs."""
    plan = one_f_one_b(4, 8)
    ops = "".join(a.op.value for a in plan.actions(0))
    assert ops == "FFF" + "FB" * 5 + "BBB"
    assert "".join(a.op.value for a in plan.actions(3)) == "FB" * 8


def test_zero_bubble_splits_backward_into_i_then_w() -> None:
    """zb uses I and W (never B); each microbatch's I comes before its W on every rank."""
    plan = zero_bubble(4, 8)
    for rank in range(4):
        acts = plan.actions(rank)
        assert Op.B not in {a.op for a in acts}
        for m in range(8):
            assert acts.index(Action(rank, Op.I, m)) < acts.index(Action(rank, Op.W, m))


def test_interleaved_places_stage_s_on_rank_s_mod_p() -> None:
    """Interleaved: P*V model stages, stage s on rank s % P, V chunks per rank."""
    plan = interleaved_1f1b(4, 8, 2)
    assert plan.num_model_stages == 8
    assert [plan.stage_to_rank(s) for s in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert {a.stage for a in plan.actions(1)} == {1, 5}
    assert len(plan.actions(1)) == 2 * 8 * 2  # F and B for 8 microbatches x 2 chunks


def test_non_interleaved_stage_is_rank() -> None:
    """Without virtual stages the model stage and the rank coincide."""
    plan = one_f_one_b(4, 4)
    assert [plan.stage_to_rank(s) for s in range(4)] == [0, 1, 2, 3]
    with pytest.raises(ConfigError, match=r"stage \(4\)"):
        plan.stage_to_rank(4)


def test_build_plan_dispatches_by_name() -> None:
    """build_plan(name, ...) equals calling the builder directly."""
    assert build_plan("gpipe", 2, 3).order == gpipe(2, 3).order
    assert build_plan("1f1b", 2, 3).order == one_f_one_b(2, 3).order
    assert build_plan("zb", 2, 3).order == zero_bubble(2, 3).order
    assert build_plan("interleaved", 2, 4, 2).order == interleaved_1f1b(2, 4, 2).order


@pytest.mark.parametrize("call,needles", [
    (lambda: build_plan("interleaved", 4, 3, 2),
     ["microbatches (3)", "multiple of stages (4)", "microbatches=4"]),
    (lambda: build_plan("interleaved", 4, 8, 1), ["virtual (1)", ">= 2", "virtual=2"]),
    (lambda: build_plan("1f1b", 4, 8, 2), ["virtual (2)", "must be 1", "'1f1b'"]),
    (lambda: build_plan("gpipe", 0, 8), ["stages (0)", ">= 1", "stages=4"]),
    (lambda: build_plan("zb", 2, 0), ["microbatches (0)", ">= 1"]),
    (lambda: build_plan("interleaved", 2, 4, 0), ["virtual (0)"]),
    (lambda: build_plan("pipedream", 2, 4), ["'pipedream'", "gpipe", "schedule='1f1b'"]),
    (lambda: gpipe(2, -1), ["microbatches (-1)"]),
    (lambda: one_f_one_b(2.5, 4), ["stages (2.5)"]),  # type: ignore[arg-type]
])
def test_bad_arguments_name_value_rule_and_example(call, needles: list[str]) -> None:
    """Bad builder arguments raise ConfigError (a LabError) naming the value and an example."""
    with pytest.raises(ConfigError) as err:
        call()
    assert isinstance(err.value, LabError)
    for needle in needles:
        assert needle in str(err.value)


def test_plan_str_is_the_table() -> None:
    """str(plan) is the text table: a title, a slot header, one row per rank with 2F0 cells."""
    text = str(one_f_one_b(2, 2))
    lines = text.splitlines()
    assert lines[0].startswith("1f1b: 2 ranks")
    assert "slot" in lines[1]
    assert lines[2].split() == ["rank", "0", "0F0", "0F1", ".", "0B0", ".", "0B1"]
    assert lines[3].split() == ["rank", "1", ".", "1F0", "1B0", "1F1", "1B1", "."]


def test_format_plan_marks_a_cell() -> None:
    """format_plan(mark=(rank, slot)) brackets that cell, flags the row and points a caret."""
    plan = gpipe(2, 2)
    text = format_plan(plan, mark=(1, 2))
    lines = text.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith(">>"))
    assert "[1F1]" in lines[row] and "rank 1" in lines[row]
    caret = lines[row + 1]
    assert caret.strip() == "^"
    assert lines[row][caret.index("^")] in "1F"  # the caret sits under the marked cell


def test_plan_actions_skips_idle_slots_and_rejects_unknown_rank() -> None:
    """actions(rank) is the order without None; an unknown rank is a ConfigError."""
    plan = gpipe(2, 2)
    assert plan.order[1][0] is None
    assert [str(a) for a in plan.actions(1)] == ["1F0", "1F1", "1B0", "1B1"]
    with pytest.raises(ConfigError, match=r"rank \(5\)"):
        plan.actions(5)


# --- hand-written orders ---------------------------------------------------------------

def _acts(text: str) -> list[Action]:
    return [Action.parse(x) for x in text.split()]


def test_plan_from_orders_lays_out_a_hand_written_order() -> None:
    """A student's per-rank 1F1B order, laid out in slots, equals the built-in plan."""
    orders = {0: _acts("0F0 0F1 0B0 0F2 0B1 0B2"),
              1: _acts("1F0 1B0 1F1 1B1 1F2 1B2")}
    plan = plan_from_orders(orders, stages=2, microbatches=3)
    assert plan.schedule == "custom"
    assert plan.order == one_f_one_b(2, 3).order
    validate_plan(plan)


def test_plan_from_orders_rejects_a_deadlocking_order() -> None:
    """Orders that wait on each other forever raise ScheduleError naming the stuck ranks."""
    orders = {0: _acts("0F0 0B0"),
              1: _acts("1B0 1F0")}
    with pytest.raises(ScheduleError, match="rank 1 at 1B0"):
        plan_from_orders(orders, stages=2, microbatches=1)
    with pytest.raises(ConfigError, match=r"microbatches \(0\)"):
        plan_from_orders(orders, stages=2, microbatches=0)
