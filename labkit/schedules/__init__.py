"""Pipeline schedules as data: build, check, print and time plans without any process.

A plan maps each rank to its actions (``2F0`` = stage 2, forward, microbatch 0). Builders
cover GPipe (Huang et al. 2019), 1F1B / PipeDream-Flush and interleaved 1F1B (Narayanan et
al. 2021) and zero bubble ZB-H1 (Qi et al. 2023). Pure Python: importing this never imports
torch.
"""

from labkit.schedules.actions import Action, Op, Plan, format_cells, format_plan
from labkit.schedules.plans import (
    CLOSED_FORM,
    SCHEDULES,
    build_plan,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    plan_from_orders,
    schedule_problems,
    zero_bubble,
)
from labkit.schedules.simulate import (
    DEFAULT_COSTS,
    SimEvent,
    peak_in_flight,
    planned_bubble_fraction,
    simulate,
)
from labkit.schedules.validate import (
    Problem,
    ScheduleError,
    check_cells,
    check_plan,
    validate_cells,
    validate_plan,
)

__all__ = [
    "CLOSED_FORM", "DEFAULT_COSTS", "SCHEDULES", "Action", "Op", "Plan", "Problem", "ScheduleError",
    "SimEvent", "build_plan", "check_cells", "check_plan", "format_cells", "format_plan",
    "gpipe", "interleaved_1f1b", "one_f_one_b", "peak_in_flight", "plan_from_orders",
    "planned_bubble_fraction", "schedule_problems", "simulate", "validate_cells",
    "validate_plan", "zero_bubble",
]
