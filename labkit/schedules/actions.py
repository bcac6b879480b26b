"""The vocabulary of a pipeline schedule: ops, actions, plans, and the plan table.

What this teaches: a pipeline schedule is *data*. Each rank owns a list of time slots; each
slot holds one action -- "run op X of model stage s on microbatch m" -- or nothing (a bubble).
An action prints as ``2F0`` (stage 2, forward, microbatch 0) and parses back from that text,
the convention of PyTorch's ``torch.distributed.pipelining`` schedules.

Ops follow the papers that introduced them:

* ``F`` forward and ``B`` full backward -- GPipe (Huang et al. 2019) and 1F1B /
  PipeDream-Flush (Narayanan et al. 2021).
* ``I`` (gradient w.r.t. the stage *input*, on the critical path) and ``W`` (gradient w.r.t.
  the stage *weights*, deferrable) -- the backward split of Zero Bubble (Qi et al. 2023).

Data dependencies are written once, here, as *tokens* an action requires and produces, so the
validator, the simulator and the lockstep slot layout all agree on what "ready" means:
``("F", s, m)`` the activation of stage s, ``("G", s, m)`` the gradient w.r.t. stage s's
input, ``("W", s, m)`` stage s's weight gradient.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from labkit.base.errors import ConfigError

Token = tuple[str, int, int]
"""A dependency token: (kind, stage, microbatch), kind one of "F", "G", "W"."""

Cells = dict[int, list[list["Action"]]]
"""A slot table that may hold several actions per slot (for checking hand-built tables)."""


class Op(enum.Enum):
    """What an action computes on its stage."""

    F = "F"  # forward
    B = "B"  # full backward: input grad and weight grad together
    I = "I"  # backward for the input grad only (Zero Bubble "B")
    W = "W"  # backward for the weight grad only (Zero Bubble "W")


_ACTION_RE = re.compile(r"^\s*(\d+)\s*([FBIW])\s*(\d+)\s*$")


@dataclass(frozen=True)
class Action:
    """One unit of work: ``op`` of model stage ``stage`` on microbatch ``microbatch``.

    ``stage`` is the MODEL stage (0 .. stages*virtual-1), not the rank that runs it; ask the
    plan's ``stage_to_rank`` for the rank.
    """

    stage: int
    op: Op
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.op.value}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> Action:
        """Inverse of ``str``: ``Action.parse("2F0") == Action(2, Op.F, 0)``."""
        match = _ACTION_RE.match(text) if isinstance(text, str) else None
        if match is None:
            raise ConfigError(
                f"cannot parse action {text!r}: expected <stage><op><microbatch> with op one "
                f"of F, B, I, W; e.g. '2F0' (stage 2, forward, microbatch 0)")
        return cls(int(match.group(1)), Op(match.group(2)), int(match.group(3)))

    def requires(self, num_stages: int) -> tuple[Token, ...]:
        """Tokens that must exist before this action can start."""
        s, m = self.stage, self.microbatch
        if self.op is Op.F:
            return (("F", s - 1, m),) if s > 0 else ()
        if self.op is Op.W:
            return (("G", s, m),)
        # B and I: own forward, plus the gradient coming back from the next stage
        upstream: tuple[Token, ...] = (("G", s + 1, m),) if s < num_stages - 1 else ()
        return (("F", s, m),) + upstream

    def produces(self) -> tuple[Token, ...]:
        """Tokens this action creates when it finishes."""
        s, m = self.stage, self.microbatch
        if self.op is Op.F:
            return (("F", s, m),)
        if self.op is Op.B:
            return (("G", s, m), ("W", s, m))
        if self.op is Op.I:
            return (("G", s, m),)
        return (("W", s, m),)


@dataclass
class Plan:
    """A pipeline schedule as data: rank -> its lockstep time slots (``None`` = idle).

    Slots are "unit time": every action occupies exactly one slot, whatever its real cost,
    and an action sits in a later slot than every action it depends on. Real durations
    (B costs about twice F) are the simulator's job, see ``labkit.schedules.simulate``.
    """

    schedule: str
    stages: int  # number of pipeline ranks P
    microbatches: int
    virtual: int
    order: dict[int, list[Action | None]] = field(default_factory=dict)

    @property
    def num_model_stages(self) -> int:
        """Model stages P*V (V model chunks per rank for interleaved schedules)."""
        return self.stages * self.virtual

    @property
    def num_slots(self) -> int:
        return max((len(slots) for slots in self.order.values()), default=0)

    def stage_to_rank(self, stage: int) -> int:
        """The rank that holds model stage ``stage`` (round-robin: stage s on rank s % P)."""
        if not 0 <= stage < self.num_model_stages:
            raise ConfigError(
                f"stage ({stage}) must be in 0..{self.num_model_stages - 1} for a plan with "
                f"{self.stages} ranks x {self.virtual} stages per rank; e.g. stage=0")
        return stage % self.stages

    def actions(self, rank: int) -> list[Action]:
        """The actions ``rank`` runs, in order, without idle slots (what the executor walks)."""
        if rank not in self.order:
            raise ConfigError(
                f"rank ({rank}) is not in this plan; it has ranks 0..{self.stages - 1}; "
                f"e.g. plan.actions(0)")
        return [a for a in self.order[rank] if a is not None]

    def cells(self) -> Cells:
        """The slot table with each slot as a list of actions (empty when idle)."""
        return {r: [[] if a is None else [a] for a in slots] for r, slots in self.order.items()}

    def __str__(self) -> str:
        return format_plan(self)


def _cell_text(actions: list[Action]) -> str:
    return "+".join(str(a) for a in actions) if actions else "."


def format_cells(cells: Cells, mark: tuple[int, int] | None = None,
                 title: str | None = None) -> str:
    """Render a slot table: one row per rank, one column per slot; ``mark`` = (rank, slot).

    The marked cell is bracketed (``[2F0]``), its row starts with ``>>`` and a ``^`` line
    under the row points at it, so a validator message can show exactly which step is wrong.
    """
    ranks = sorted(cells)
    width = max((len(_cell_text(c)) for r in ranks for c in cells[r]), default=1)
    slots = max((len(cells[r]) for r in ranks), default=0)
    col = width + 2  # room for the brackets of a marked cell
    label = max(len(f"rank {r}") for r in ranks) if ranks else 4
    lines = [title] if title else []
    lines.append("   " + "slot".ljust(label) + "".join(str(t).center(col) for t in range(slots)))
    for r in ranks:
        row = cells[r] + [[]] * (slots - len(cells[r]))
        texts = []
        for t, c in enumerate(row):
            text = _cell_text(c)
            texts.append((f"[{text}]" if mark == (r, t) else text).center(col))
        marked = mark is not None and mark[0] == r
        lines.append((">> " if marked else "   ") + f"rank {r}".ljust(label) + "".join(texts))
        if marked and mark is not None and 0 <= mark[1] < slots:
            lines.append(" " * (3 + label + col * mark[1] + col // 2) + "^")
    return "\n".join(line.rstrip() for line in lines)


def format_plan(plan: Plan, mark: tuple[int, int] | None = None) -> str:
    """The plan as a text table (see ``format_cells``), titled with its shape."""
    title = (f"{plan.schedule}: {plan.stages} ranks x {plan.virtual} stage(s) per rank, "
             f"{plan.microbatches} microbatches, {plan.num_slots} unit-time slots")
    return format_cells(plan.cells(), mark=mark, title=title)
