"""Pipeline parallelism's settings, metrics record and registration (``labkit.strategies.pipeline``).

Torch-free: discovery imports this (through the package) in the supervisor, which validates a
config and builds the CLI flags from it before any process starts; the rank code lives in the
sibling modules and is imported only inside the ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labkit.base.errors import ConfigError, LabError
from labkit.base.validate import check_fields, integer, integers, one_of, option
from labkit.config.registry import Strategy, register
from labkit.schedules.plans import SCHEDULES, schedule_problems

BALANCE = ("count", "cost")


@dataclass(kw_only=True, frozen=True)
class PipelineOptions:
    """Settings of the pipeline strategy (every field is a ``labkit run pipeline`` flag)."""

    schedule: str = "1f1b"
    """gpipe (all forwards, then all backwards), 1f1b, interleaved (virtual stages) or zb."""
    stages: int | None = option(None, integer(1, 64, example=2, optional=True))
    """Pipeline ranks P (must equal world_size; default: world_size)."""
    microbatches: int = option(4, integer(1, 4096, example=4))
    """Microbatches M per step; batch_size must be a multiple of M."""
    virtual: int | None = option(None, integer(1, 64, example=2, optional=True))
    """Model chunks per rank V (interleaved only; default 2 for interleaved, else 1)."""
    layer_costs: tuple[int, ...] = option((), integers(
        1, example=(1, 1, 4, 4), why=" (matmuls per layer)"))
    """Relative cost of each layer (how many width x width matmuls it runs); one per
    model.depth layer; default: all 1. E.g. 1 1 1 1 4 4 4 4 for an unbalanced model."""
    balance: str = option("count", one_of(BALANCE, example="cost"))
    """How layers are split into stages: count (equal layer counts) or cost (by the
    per-layer time measured on rank 0 before training)."""
    orders: str = ""
    """A hand-written plan instead of --schedule: per rank a list of actions, ranks
    separated by ';', e.g. "0F0 0F1 0B0 0B1; 1F0 1B0 1F1 1B1"."""

    def __post_init__(self) -> None:
        if isinstance(self.layer_costs, list):
            object.__setattr__(self, "layer_costs", tuple(self.layer_costs))
        problems = check_fields(self)
        if not any(p.startswith("virtual") for p in problems) and (
                self.schedule not in SCHEDULES or not self.orders):  # the schedule's own rules
            problems += schedule_problems(self.schedule, virtual=self.resolved_virtual())
        if problems:
            raise ConfigError(problems)

    def resolved_virtual(self) -> int:
        if self.virtual is not None:
            return self.virtual
        return 2 if self.schedule == "interleaved" else 1


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


def lesson_mlp_shape(given: dict[str, Any]) -> dict[str, Any]:
    """The pipeline lesson's MLP: 1024 wide, 16 blocks, and an input as wide as a block
    (``in_dim`` follows ``width`` unless given), so the first stage's first block costs what
    every other block does and equal block counts give equal stages."""
    return {"width": 1024, "depth": 16, "in_dim": given.get("width", 1024)}


def pipeline_model(width: int, depth: int, **fields: Any) -> Any:
    """A ``ModelConfig`` for an MLP pipeline whose blocks all cost alike (``in_dim = width``)."""
    from labkit.config.run import ModelConfig

    return ModelConfig(width=width, depth=depth, **{"in_dim": width, **fields})


register(Strategy(
    name="pipeline", entry="labkit.strategies.pipeline.executor:train", options=PipelineOptions,
    summary="pipeline parallel: GPipe / 1F1B / interleaved / zero-bubble plans on real ranks",
    check=check, lesson="03_pipeline_parallelism", axis="pp",
    # heavy enough that each action computes for tens of ms: the measured bubble then
    # follows (p-1)/(m+p-1) (docs/benchmarks.md, lesson 03); the lesson shows small ones too
    defaults={"steps": 6, "batch_size": 1024, "model": {"mlp": lesson_mlp_shape}},
    model_entries={"gpt": "labkit.strategies.hybrid.impl:train"}))

__all__ = ["PipelineOptions", "check", "orders_text", "parse_orders", "plan_for"]
