"""The schedule validator: hand-broken plans are rejected and the error marks the step."""

from __future__ import annotations

import copy

import pytest

from labkit.base.errors import LabError
from labkit.schedules import (
    Action,
    Op,
    Plan,
    ScheduleError,
    check_cells,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    validate_cells,
    validate_plan,
    zero_bubble,
)

pytestmark = pytest.mark.lesson03


# --- validator: hand-broken plans --------------------------------------------------------

def _broken(plan: Plan) -> ScheduleError:
    with pytest.raises(ScheduleError) as err:
        validate_plan(plan)
    assert err.value.problems and err.value.table
    assert isinstance(err.value, LabError)
    return err.value


def _marked(err: ScheduleError) -> str:
    """The bracketed cell in the error table."""
    line = next(line for line in err.table.splitlines() if line.startswith(">>"))
    return line[line.index("[") + 1:line.index("]")]


def test_swapped_forward_and_backward_is_rejected() -> None:
    """Swapping 1F0 and 1B0 on rank 1 breaks 'F before B'; the table marks 1B0."""
    plan = one_f_one_b(3, 4)
    row = plan.order[1]
    f, b = row.index(Action(1, Op.F, 0)), row.index(Action(1, Op.B, 0))
    row[f], row[b] = row[b], row[f]
    err = _broken(plan)
    assert any("1B0" in p and "forward of its own stage" in p for p in err.problems)
    assert _marked(err) == "1B0"


def test_dropped_action_is_rejected() -> None:
    """Removing 0B2 from rank 0 reports it missing."""
    plan = one_f_one_b(2, 4)
    row = plan.order[0]
    row[row.index(Action(0, Op.B, 2))] = None
    err = _broken(plan)
    assert any("0B2 is missing" in p for p in err.problems)


def test_dropped_weight_grad_is_rejected() -> None:
    """In a zero-bubble plan an I without its W is reported as a missing W."""
    plan = zero_bubble(2, 3)
    row = plan.order[1]
    row[row.index(Action(1, Op.W, 1))] = None
    assert any("1W1 is missing" in p for p in _broken(plan).problems)


def test_weight_grad_before_input_grad_is_rejected() -> None:
    """W before I of the same stage and microbatch breaks 'I before W'; W is marked."""
    plan = zero_bubble(2, 2)
    row = plan.order[0]
    i, w = row.index(Action(0, Op.I, 0)), row.index(Action(0, Op.W, 0))
    row[i], row[w] = row[w], row[i]
    err = _broken(plan)
    assert any("W (weight grad) needs I" in p for p in err.problems)
    assert _marked(err) == "0W0"


def test_forward_on_stage_1_before_stage_0_is_rejected() -> None:
    """1F0 in slot 0 (before 0F0 finished) breaks the forward dependency; 1F0 is marked."""
    plan = gpipe(2, 2)
    row = plan.order[1]
    row[0], row[1] = row[1], None
    err = _broken(plan)
    assert any("1F0 in slot 0" in p and "stage 0's activation" in p for p in err.problems)
    assert _marked(err) == "1F0"
    assert "rank 1, slot 0" in err.problems[0]


def test_backward_before_next_stage_backward_is_rejected() -> None:
    """0B0 in the same slot as 1B0 breaks 'B on s+1 before B on s'."""
    plan = gpipe(2, 1)  # rank0: 0F0 . . 0B0 ; rank1: . 1F0 1B0 .
    plan.order[0][2], plan.order[0][3] = plan.order[0][3], None
    err = _broken(plan)
    assert any("gradient from stage 1" in p for p in err.problems)
    assert _marked(err) == "0B0"


def test_double_booked_slot_is_rejected() -> None:
    """Two actions in one slot (a multi-action table) are rejected and the slot is marked."""
    cells = gpipe(2, 2).cells()
    cells[0][1] = cells[0][1] + cells[0][0]  # 0F1 and 0F0 in slot 1
    cells[0][0] = []
    problems = check_cells(cells, stages=2, microbatches=2)
    assert any(p.slot == 1 and "double-booked" in p.message for p in problems)
    with pytest.raises(ScheduleError) as err:
        validate_cells(cells, stages=2, microbatches=2)
    assert "[0F1+0F0]" in err.value.table


def test_duplicated_action_is_rejected() -> None:
    """The same action in two slots is reported as running twice."""
    plan = gpipe(2, 2)
    plan.order[0].append(Action(0, Op.F, 0))
    plan.order[1].append(None)
    assert any("0F0 runs twice" in p for p in _broken(plan).problems)


def test_action_on_wrong_rank_is_rejected() -> None:
    """1F0 placed on rank 0 is reported: stage 1 lives on rank 1."""
    plan = gpipe(2, 1)
    plan.order[0][1], plan.order[1][1] = plan.order[1][1], None
    err = _broken(plan)
    assert any("1F0 is on rank 0" in p and "lives on rank 1" in p for p in err.problems)
    assert _marked(err) == "1F0"


def test_interleaved_wrong_chunk_rank_is_rejected() -> None:
    """With V=2, stage 5 lives on rank 1 of 4 (5 % 4); moving it to rank 0 is rejected."""
    plan = interleaved_1f1b(4, 4, 2)
    bad = copy.deepcopy(plan)
    slot = bad.order[1].index(Action(5, Op.F, 0))
    bad.order[0][slot], bad.order[1][slot] = bad.order[1][slot], bad.order[0][slot]
    assert any("stage 5 lives on rank 1" in p for p in _broken(bad).problems)


def test_out_of_range_and_non_action_cells_are_rejected() -> None:
    """A microbatch past the end, or a string in a slot, is a problem, not a crash."""
    plan = gpipe(2, 2)
    plan.order[0].append(Action(0, Op.F, 9))
    plan.order[1].append("0F0")  # type: ignore[arg-type]
    problems = _broken(plan).problems
    assert any("out of range" in p for p in problems)
    assert any("'0F0'" in p and "one Action or None" in p for p in problems)


def test_error_lists_problems_and_shows_the_table() -> None:
    """str(ScheduleError) holds each problem and the marked table, ready for a notebook."""
    plan = gpipe(2, 2)
    plan.order[1][1], plan.order[1][0] = None, plan.order[1][1]
    err = _broken(plan)
    text = str(err)
    assert "invalid pipeline schedule" in text and err.problems[0] in text
    assert err.table in text and "[1F0]" in text
