"""Check a pipeline plan without starting any process.

What this teaches: the rules every correct schedule obeys, whatever its order. They are the
invariants PyTorch's pipelining tests check on its schedules (``TestSchedulePlan``):

1. Completeness: every (stage, microbatch) has exactly one F, and exactly one B -- or, for
   the zero-bubble split (Qi et al. 2023), exactly one I and one W, I before W.
2. Placement: an action runs on the rank that owns its stage (stage s on rank s % P).
3. Forward dependency: per microbatch, F on stage s runs in an earlier slot than F on s+1.
4. Backward dependency: B (or I) on stage s+1 runs earlier than B (or I) on stage s, and a
   stage's backward runs after its own forward.
5. One thing at a time: a rank runs at most one action per slot, and no action twice.

A plan that obeys 3-4 slot by slot is also deadlock-free when executed rank by rank with
blocking receives: every input is produced in an earlier slot than it is consumed.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.base.errors import LabError
from labkit.schedules.actions import Action, Cells, Op, Plan, Token, format_cells, format_plan


@dataclass(frozen=True)
class Problem:
    """One broken rule; ``rank``/``slot`` locate the offending step (None when unknown)."""

    rank: int | None
    slot: int | None
    message: str

    def __str__(self) -> str:
        where = f"rank {self.rank}" if self.rank is not None else "plan"
        where += f", slot {self.slot}" if self.slot is not None else ""
        return f"{where}: {self.message}"


class ScheduleError(LabError):
    """A plan broke a schedule rule; ``problems`` lists them, ``table`` shows the plan with
    the first offending step marked."""

    def __init__(self, problems: list[str], table: str = ""):
        self.problems = list(problems)
        self.table = table
        head = f"invalid pipeline schedule ({len(self.problems)} problem(s)):\n"
        listed = "\n".join(f"  - {p}" for p in self.problems[:10])
        more = f"\n  ... and {len(self.problems) - 10} more" if len(self.problems) > 10 else ""
        super().__init__(head + listed + more + (f"\n\n{table}" if table else ""))


_DEP_RULE = {
    ("F", "F"): "forward on stage {s} needs stage {u}'s activation from an earlier slot",
    ("B", "F"): "a backward needs the forward of its own stage in an earlier slot",
    ("B", "G"): "backward on stage {s} needs the gradient from stage {u} in an earlier slot",
    ("W", "G"): "W (weight grad) needs I (input grad) of the same stage in an earlier slot",
}


def _dep_rule(action: Action, token: Token) -> str:
    kind = "B" if action.op in (Op.B, Op.I) else action.op.value
    return _DEP_RULE[(kind, token[0])].format(s=action.stage, u=token[1])


def check_cells(cells: Cells, *, stages: int, microbatches: int,
                virtual: int = 1) -> list[Problem]:
    """All broken rules of a slot table that may hold several actions per slot."""
    problems: list[Problem] = []
    num_stages = stages * virtual
    # 1. shape: ranks 0..P-1, actions in range and on the rank owning their stage
    if sorted(cells) != list(range(stages)):
        problems.append(Problem(None, None, f"ranks {sorted(cells)} must be exactly "
                                            f"0..{stages - 1} for stages={stages}"))
    seen: dict[Action, tuple[int, int]] = {}
    for rank in sorted(cells):
        for slot, cell in enumerate(cells[rank]):
            if len(cell) > 1:
                names = ", ".join(str(a) for a in cell)
                problems.append(Problem(rank, slot, f"slot double-booked: {names}; a rank "
                                                    f"runs one action per slot"))
            for a in cell:
                if not (0 <= a.stage < num_stages and 0 <= a.microbatch < microbatches):
                    problems.append(Problem(rank, slot, (
                        f"{a} is out of range: stages are 0..{num_stages - 1} and "
                        f"microbatches 0..{microbatches - 1}")))
                    continue
                if a.stage % stages != rank:
                    problems.append(Problem(rank, slot, (
                        f"{a} is on rank {rank} but stage {a.stage} lives on rank "
                        f"{a.stage % stages} (stage s on rank s % {stages})")))
                if a in seen:
                    r0, t0 = seen[a]
                    problems.append(Problem(rank, slot, (
                        f"{a} runs twice (first on rank {r0}, slot {t0}); each action "
                        f"runs exactly once")))
                else:
                    seen[a] = (rank, slot)
    # 2. completeness: one F, and one B or one I + one W, per (stage, microbatch)
    for s in range(num_stages):
        owner = s % stages
        for m in range(microbatches):
            has = {op: Action(s, op, m) in seen for op in Op}
            missing: list[Op] = [] if has[Op.F] else [Op.F]
            if has[Op.B] and (has[Op.I] or has[Op.W]):
                problems.append(Problem(owner, seen[Action(s, Op.B, m)][1], (
                    f"stage {s} microbatch {m} has both B and I/W; use either one B or "
                    f"one I and one W")))
            elif not has[Op.B]:
                if has[Op.I] != has[Op.W]:
                    missing.append(Op.W if has[Op.I] else Op.I)
                elif not has[Op.I]:
                    missing.append(Op.B)
            for op in missing:
                problems.append(Problem(owner, None, (
                    f"{Action(s, op, m)} is missing: every stage runs one F and one B (or "
                    f"one I and one W) per microbatch")))
    # 3. dependencies: every input produced in a strictly earlier slot
    produced: dict[Token, tuple[int, int, Action]] = {}
    for a, (r, t) in seen.items():
        for token in a.produces():
            if token not in produced or t < produced[token][1]:
                produced[token] = (r, t, a)
    for a, (r, t) in sorted(seen.items(), key=lambda kv: (kv[1][1], kv[1][0])):
        for token in a.requires(num_stages):
            if token in produced and produced[token][1] >= t:
                pr, pt, pa = produced[token]
                problems.append(Problem(r, t, (
                    f"{a} in slot {t} but its input {pa} is in slot {pt} (rank {pr}): "
                    f"{_dep_rule(a, token)}")))
    return problems


def check_plan(plan: Plan) -> list[Problem]:
    """All broken rules of ``plan`` (empty when valid)."""
    problems: list[Problem] = []
    cells: Cells = {}
    for rank, slots in plan.order.items():
        cells[rank] = []
        for slot, a in enumerate(slots):
            if a is None or isinstance(a, Action):
                cells[rank].append([] if a is None else [a])
            else:
                cells[rank].append([])
                problems.append(Problem(rank, slot, (
                    f"slot holds {a!r}; a slot holds one Action or None (idle), e.g. "
                    f"Action.parse('0F0')")))
    return problems + check_cells(cells, stages=plan.stages,
                                  microbatches=plan.microbatches, virtual=plan.virtual)


def _first_mark(problems: list[Problem]) -> tuple[int, int] | None:
    located = [p for p in problems if p.rank is not None and p.slot is not None]
    if not located:
        return None
    first = min(located, key=lambda p: (p.slot, p.rank))
    assert first.rank is not None and first.slot is not None
    return first.rank, first.slot


def validate_cells(cells: Cells, *, stages: int, microbatches: int, virtual: int = 1) -> None:
    """Raise ScheduleError if a (possibly multi-action-per-slot) table breaks a rule."""
    problems = check_cells(cells, stages=stages, microbatches=microbatches, virtual=virtual)
    if problems:
        table = format_cells(cells, mark=_first_mark(problems))
        raise ScheduleError([str(p) for p in problems], table)


def validate_plan(plan: Plan) -> None:
    """Raise ScheduleError listing every broken rule, with the first offending step marked."""
    problems = check_plan(plan)
    if problems:
        raise ScheduleError([str(p) for p in problems],
                            format_plan(plan, mark=_first_mark(problems)))
