"""Pipeline parallelism (lesson 03): options and registration only -- torch-free.

``labkit run pipeline --schedule gpipe|1f1b|interleaved|zb --stages P --microbatches M
[--virtual V]`` runs a plan from ``labkit.schedules`` on P real ranks (see ``executor``).
``--orders "0F0 0F1 0B0 0B1; 1F0 1B0 1F1 1B1"`` runs a hand-written plan instead (one
``;``-separated list of actions per rank), e.g. a student's 1F1B.

Every rule is checked here, before any process starts: the schedule's own rules (the
interleaved schedule needs microbatches to be a multiple of stages), one rank per stage,
at least one layer per model stage, and a batch that splits into equal microbatches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labkit.base.errors import ConfigError, LabError
from labkit.config.registry import Strategy, register
from labkit.schedules.plans import SCHEDULES, schedule_problems

BALANCE = ("count", "cost")


@dataclass(kw_only=True, frozen=True)
class PipelineOptions:
    """Settings of the pipeline strategy (every field is a ``labkit run pipeline`` flag)."""

    schedule: str = "1f1b"
    """gpipe (all forwards, then all backwards), 1f1b, interleaved (virtual stages) or zb."""
    stages: int | None = None
    """Pipeline ranks P (must equal world_size; default: world_size)."""
    microbatches: int = 4
    """Microbatches M per step; batch_size must be a multiple of M."""
    virtual: int | None = None
    """Model chunks per rank V (interleaved only; default 2 for interleaved, else 1)."""
    layer_costs: tuple[int, ...] = ()
    """Relative cost of each layer (how many width x width matmuls it runs); one per
    model.depth layer; default: all 1. E.g. 1 1 1 1 4 4 4 4 for an unbalanced model."""
    balance: str = "count"
    """How layers are split into stages: count (equal layer counts) or cost (by the
    per-layer time measured on rank 0 before training)."""
    orders: str = ""
    """A hand-written plan instead of --schedule: per rank a list of actions, ranks
    separated by ';', e.g. "0F0 0F1 0B0 0B1; 1F0 1B0 1F1 1B1"."""

    def __post_init__(self) -> None:
        problems: list[str] = []
        if not _is_int(self.microbatches, 1):
            problems.append(f"microbatches ({self.microbatches!r}) must be an integer >= 1; "
                            f"e.g. microbatches=4")
        if self.stages is not None and not _is_int(self.stages, 1):
            problems.append(f"stages ({self.stages!r}) must be an integer >= 1; e.g. stages=2")
        if self.virtual is not None and not _is_int(self.virtual, 1):
            problems.append(f"virtual ({self.virtual!r}) must be an integer >= 1; "
                            f"e.g. virtual=2")
        elif self.schedule not in SCHEDULES or not self.orders:  # the schedule's own rules
            problems += schedule_problems(self.schedule, virtual=self.resolved_virtual())
        costs = tuple(self.layer_costs)
        if any(not _is_int(c, 1) for c in costs):
            problems.append(f"layer_costs ({list(costs)}) must be integers >= 1 (matmuls per "
                            f"layer); e.g. layer_costs=(1, 1, 4, 4)")
        object.__setattr__(self, "layer_costs", costs)
        if self.balance not in BALANCE:
            problems.append(f"balance ({self.balance!r}) must be one of {', '.join(BALANCE)}; "
                            f"e.g. balance='cost'")
        if problems:
            raise ConfigError(problems)

    def resolved_virtual(self) -> int:
        if self.virtual is not None:
            return self.virtual
        return 2 if self.schedule == "interleaved" else 1


def _is_int(value: object, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def parse_orders(text: str) -> dict[int, list[Any]]:
    """``"0F0 0B0; 1F0 1B0"`` -> {0: [0F0, 0B0], 1: [1F0, 1B0]} (Actions)."""
    from labkit.schedules import Action

    ranks = [part.replace(",", " ").split() for part in text.split(";")]
    return {r: [Action.parse(t) for t in tokens] for r, tokens in enumerate(ranks)}


def orders_text(plan: Any) -> str:
    """The inverse of ``parse_orders`` for a ``labkit.schedules.Plan`` (idle slots dropped)."""
    return "; ".join(" ".join(str(a) for a in plan.actions(r)) for r in sorted(plan.order))


def plan_for(opts: PipelineOptions, stages: int) -> Any:
    """The ``labkit.schedules.Plan`` these options describe (validated; may raise LabError)."""
    from labkit.schedules import build_plan, plan_from_orders, validate_plan

    virtual = opts.resolved_virtual()
    if opts.orders:
        plan = plan_from_orders(parse_orders(opts.orders), stages=stages,
                                microbatches=opts.microbatches, virtual=virtual)
    else:
        plan = build_plan(opts.schedule, stages, opts.microbatches, virtual)
    validate_plan(plan)
    return plan


def check(config: Any) -> list[str]:
    """Rules across RunConfig fields, checked before any process starts."""
    opts: PipelineOptions = config.options
    stages = opts.stages if opts.stages is not None else config.world_size
    if config.model.kind == "gpt" and (opts.schedule not in ("gpipe", "1f1b") or opts.orders
                                        or opts.layer_costs):
        return [f"--model gpt runs the gpipe and 1f1b schedules on its blocks (not "
                f"{opts.orders and 'a hand-written plan' or opts.schedule!r}, no layer_costs); "
                f"interleaved and zero bubble run on the MLP; e.g. --schedule 1f1b"]
    virtual = opts.resolved_virtual()
    depth = config.model.depth
    problems: list[str] = []
    if stages != config.world_size:
        problems.append(f"stages ({stages}) must equal world_size ({config.world_size}): one "
                        f"rank per pipeline stage; e.g. world_size={stages}, stages={stages}")
    if stages * virtual > depth:
        problems.append(f"stages x virtual ({stages} x {virtual} = {stages * virtual} model "
                        f"stages) must be <= model.depth ({depth} layers): every stage needs "
                        f"a layer; e.g. depth={stages * virtual} or more")
    if config.batch_size % opts.microbatches:
        good = max(opts.microbatches, config.batch_size // opts.microbatches * opts.microbatches)
        problems.append(f"batch_size ({config.batch_size}) must be divisible by microbatches "
                        f"({opts.microbatches}) so microbatches are equal; e.g. "
                        f"batch_size={good}")
    if opts.layer_costs and len(opts.layer_costs) != depth:
        problems.append(f"layer_costs has {len(opts.layer_costs)} entries but model.depth is "
                        f"{depth}: give one cost per layer; e.g. layer_costs="
                        f"{tuple([1] * depth)}")
    try:  # the schedule's own rules (and a hand-written plan's) with the step marked
        plan_for(opts, stages)
    except LabError as err:
        problems.append(str(err))
    return problems


def options_for(config: Any) -> PipelineOptions:
    opts = config.options
    return opts if isinstance(opts, PipelineOptions) else PipelineOptions(**(opts or {}))


register(Strategy(
    name="pipeline", entry="labkit.strategies.pipeline.executor:train", options=PipelineOptions,
    summary="pipeline parallel: GPipe / 1F1B / interleaved / zero-bubble plans on real ranks",
    check=check, lesson="03_pipeline_parallelism", axis="pp",
    # heavy enough that each action computes for tens of ms: the measured bubble then
    # follows (p-1)/(m+p-1) (docs/benchmarks.md, lesson 03); the lesson shows small ones too
    defaults={"steps": 6, "batch_size": 1024, "model": {"mlp": {"width": 1024, "depth": 16}}}))

__all__ = ["PipelineOptions", "check", "orders_text", "parse_orders", "plan_for"]
