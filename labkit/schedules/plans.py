"""Pipeline schedules built by pure functions: GPipe, 1F1B, interleaved 1F1B, zero bubble.

What this teaches: every schedule is a per-rank ORDER of actions, and the classic ones differ
only in that order.

* GPipe (Huang et al. 2019): all forwards, then all backwards. Simple, but every rank holds
  the activations of all m microbatches at once.
* 1F1B / PipeDream-Flush (Narayanan et al. 2021): a short warmup of forwards, then one
  forward / one backward alternately, then a cooldown of backwards. Same bubble as GPipe,
  but rank r holds at most p - r microbatches.
* Interleaved 1F1B (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on
  GPU Clusters Using Megatron-LM"): each rank holds V model chunks (stage s on rank s % p),
  so a microbatch visits every rank V times and the bubble shrinks by about V.
* Zero bubble ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): the backward is
  split into I (input grad, which the previous stage waits for) and W (weight grad, which
  nobody waits for); the deferred Ws fill the cooldown bubbles at 1F1B's memory.

Slot layout: the order is laid out in lockstep "unit time" slots by running it with every op
costing one slot and no communication delay; an action lands in the first slot after all its
inputs exist. So tables look like the textbook diagrams (GPipe: a staircase of Fs, then a
staircase of Bs). The slot widths are NOT real costs; ``simulate`` uses real ones.
"""

from __future__ import annotations

from collections.abc import Callable

from labkit.base.errors import ConfigError
from labkit.schedules.actions import Action, Cells, Op, Plan, Token, format_cells
from labkit.schedules.validate import ScheduleError

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb")
"""Every schedule labkit builds; the one list the CLI, the options, the widgets read."""
CLOSED_FORM = ("gpipe", "1f1b", "interleaved")
"""Schedules whose bubble has a closed form (``labkit.theory.bubble_fraction``); zero
bubble's comes from simulating its plan."""


def _check_counts(stages: int, microbatches: int, virtual: int) -> None:
    """Raise ConfigError unless every count is an integer >= 1."""
    problems = [f"{name} ({value!r}) must be an integer >= 1; e.g. {name}={example}"
                for name, value, example in (("stages", stages, 4),
                                             ("microbatches", microbatches, 8),
                                             ("virtual", virtual, 1))
                if not isinstance(value, int) or isinstance(value, bool) or value < 1]
    if problems:
        raise ConfigError(problems)


def schedule_problems(schedule: str, stages: int | None = None,
                      microbatches: int | None = None, virtual: int = 1) -> list[str]:
    """Every rule a schedule puts on its counts, as messages (empty: fine).

    The rules live here once: the pipeline options, the calculators and the plan builders
    all ask. ``stages`` / ``microbatches`` None skip the rules that need them.
    """
    if schedule not in SCHEDULES:
        return [f"schedule ({schedule!r}) must be one of {', '.join(SCHEDULES)}; "
                f"e.g. schedule='1f1b'"]
    problems: list[str] = []
    if schedule == "interleaved":
        if virtual < 2:
            problems.append(
                f"virtual ({virtual}) must be >= 2 for interleaved 1F1B (model chunks per "
                f"rank); e.g. virtual=2")
        if stages is not None and microbatches is not None and microbatches % stages:
            good = (microbatches // stages + 1) * stages
            problems.append(
                f"microbatches ({microbatches}) must be a multiple of stages ({stages}) for "
                f"interleaved 1F1B; e.g. microbatches={good}")
    elif virtual != 1:
        problems.append(
            f"virtual ({virtual}) must be 1 for schedule {schedule!r} (one stage per rank); "
            f"use schedule='interleaved' for virtual stages; e.g. virtual=1")
    return problems


def _check_args(schedule: str, stages: int, microbatches: int, virtual: int) -> None:
    """Raise ConfigError naming every bad value, the rule, and a valid example."""
    _check_counts(stages, microbatches, virtual)
    problems = schedule_problems(schedule, stages, microbatches, virtual)
    if problems:
        raise ConfigError(problems)


def _as_cells(slots: dict[int, list[Action | None]]) -> Cells:
    return {r: [[] if a is None else [a] for a in row] for r, row in slots.items()}


def _layout(orders: dict[int, list[Action]], num_stages: int) -> dict[int, list[Action | None]]:
    """Place each rank's order in unit-time slots: an action goes in the first slot after
    every token it requires was produced (in an earlier slot)."""
    slots: dict[int, list[Action | None]] = {r: [] for r in orders}
    ready: set[Token] = set()
    pos = dict.fromkeys(orders, 0)
    while any(pos[r] < len(orders[r]) for r in orders):
        fired: list[Action] = []
        for r, order in orders.items():
            nxt = order[pos[r]] if pos[r] < len(order) else None
            if nxt is not None and all(t in ready for t in nxt.requires(num_stages)):
                fired.append(nxt)
                pos[r] += 1
                slots[r].append(nxt)
            else:
                slots[r].append(None)
        if not fired:
            stuck = ", ".join(f"rank {r} at {orders[r][pos[r]]}"
                              for r in orders if pos[r] < len(orders[r]))
            message = f"the order deadlocks: {stuck} wait for inputs that are never produced"
            raise ScheduleError([message], format_cells(_as_cells(slots)))
        for a in fired:
            ready.update(a.produces())
    return slots


def plan_from_orders(orders: dict[int, list[Action]], *, stages: int, microbatches: int,
                     virtual: int = 1, schedule: str = "custom") -> Plan:
    """Lay hand-written per-rank orders out in unit-time slots (e.g. a student's 1F1B).

    Raises ScheduleError if the orders deadlock; run ``validate_plan`` on the result to check
    the other rules (completeness, ranks, one F and one B per stage and microbatch).
    """
    _check_counts(stages, microbatches, virtual)
    order = _layout(orders, stages * virtual)
    return Plan(schedule, stages, microbatches, virtual, order)


def _plan(schedule: str, stages: int, microbatches: int, virtual: int,
          orders: dict[int, list[Action]]) -> Plan:
    return plan_from_orders(orders, stages=stages, microbatches=microbatches,
                            virtual=virtual, schedule=schedule)


def gpipe(stages: int, microbatches: int) -> Plan:
    """GPipe: every rank runs all m forwards, then all m backwards."""
    _check_args("gpipe", stages, microbatches, 1)
    orders = {r: [Action(r, Op.F, i) for i in range(microbatches)]
              + [Action(r, Op.B, i) for i in range(microbatches)] for r in range(stages)}
    return _plan("gpipe", stages, microbatches, 1, orders)


def _one_f_one_b_order(rank: int, stages: int, microbatches: int, split: bool) -> list[Action]:
    """The 1F1B order of one rank; with ``split`` each B becomes I, and W lags behind."""
    warmup = min(stages - rank - 1, microbatches)
    back = Op.I if split else Op.B
    # ZB-H1 delays W on rank r by r steps, so every rank holds up to p microbatches (the
    # 1F1B peak of rank 0) and the deferred Ws are left over to fill the cooldown bubbles
    lag = rank if split else 0
    order: list[Action] = []
    weights = 0  # Ws emitted so far (split only)
    # 1. warmup: forwards only, enough to keep the ranks downstream busy until the first
    #    backward comes back (rank r runs p - r - 1 of them)
    order += [Action(rank, Op.F, i) for i in range(warmup)]
    # 2. steady: one forward, one backward (F, I and maybe a lagging W when split)
    for i in range(microbatches - warmup):
        order += [Action(rank, Op.F, warmup + i), Action(rank, back, i)]
        if split and i >= lag:
            order.append(Action(rank, Op.W, weights))
            weights += 1
    # 3. cooldown: the backwards of the warmup forwards; when split, a deferred W after each
    #    I fills the wait for the next gradient from downstream, the rest drain at the end
    for i in range(microbatches - warmup, microbatches):
        order.append(Action(rank, back, i))
        if split and weights < i + 1 - lag:
            order.append(Action(rank, Op.W, weights))
            weights += 1
    if split:
        order += [Action(rank, Op.W, i) for i in range(weights, microbatches)]
    return order


def one_f_one_b(stages: int, microbatches: int) -> Plan:
    """1F1B (PipeDream-Flush): warmup forwards, then alternate F and B, then cooldown Bs."""
    _check_args("1f1b", stages, microbatches, 1)
    orders = {r: _one_f_one_b_order(r, stages, microbatches, split=False)
              for r in range(stages)}
    return _plan("1f1b", stages, microbatches, 1, orders)


def interleaved_1f1b(stages: int, microbatches: int, virtual: int) -> Plan:
    """Interleaved 1F1B (Megatron-LM): V model chunks per rank, stage s on rank s % P.

    Each rank sees m*V "virtual microbatches". Forwards sweep the chunks in groups of P
    microbatches (chunk 0 for microbatches 0..P-1, then chunk 1 for the same ones, ...);
    backwards sweep the chunks in reverse.
    """
    _check_args("interleaved", stages, microbatches, virtual)
    p, v = stages, virtual
    total = microbatches * v

    def forward(rank: int, k: int) -> Action:
        chunk = (k // p) % v
        return Action(chunk * p + rank, Op.F, (k // (p * v)) * p + k % p)

    def backward(rank: int, k: int) -> Action:
        chunk = v - 1 - (k // p) % v
        return Action(chunk * p + rank, Op.B, (k // (p * v)) * p + k % p)

    orders: dict[int, list[Action]] = {}
    for rank in range(p):
        # 1. warmup: the round trip is 2 hops per downstream rank, plus one full group of P
        #    microbatches for every extra chunk before the first backward can start
        warmup = min(2 * (p - rank - 1) + (v - 1) * p, total)
        order = [forward(rank, k) for k in range(warmup)]
        # 2. steady: one forward, one backward
        for k in range(total - warmup):
            order += [forward(rank, warmup + k), backward(rank, k)]
        # 3. cooldown: the backwards still owed for the warmup forwards
        order += [backward(rank, k) for k in range(total - warmup, total)]
        orders[rank] = order
    return _plan("interleaved", stages, microbatches, virtual, orders)


def zero_bubble(stages: int, microbatches: int) -> Plan:
    """ZB-H1 style zero bubble: 1F1B with B split into I then W; Ws fill cooldown bubbles."""
    _check_args("zb", stages, microbatches, 1)
    orders = {r: _one_f_one_b_order(r, stages, microbatches, split=True)
              for r in range(stages)}
    return _plan("zb", stages, microbatches, 1, orders)


def build_plan(schedule: str, stages: int, microbatches: int, virtual: int = 1) -> Plan:
    """Build a plan by name: "gpipe" | "1f1b" | "interleaved" | "zb"."""
    builders: dict[str, Callable[[], Plan]] = {
        "gpipe": lambda: gpipe(stages, microbatches),
        "1f1b": lambda: one_f_one_b(stages, microbatches),
        "interleaved": lambda: interleaved_1f1b(stages, microbatches, virtual),
        "zb": lambda: zero_bubble(stages, microbatches),
    }
    if schedule not in builders:
        raise ConfigError(
            f"schedule ({schedule!r}) must be one of {', '.join(SCHEDULES)}; "
            f"e.g. schedule='1f1b'")
    _check_args(schedule, stages, microbatches, virtual)
    return builders[schedule]()
