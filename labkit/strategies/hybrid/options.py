"""3D parallelism's settings, metrics record and registration (``labkit.strategies.hybrid``).

Torch-free: discovery imports this (through the package) in the supervisor, which validates a
config and builds the CLI flags from it before any process starts; the rank code lives in the
sibling modules and is imported only inside the ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from labkit.base.errors import ConfigError
from labkit.base.grid import Grid
from labkit.base.validate import check_fields, flag, integer, one_of, option, real
from labkit.config.metrics import RankMetrics
from labkit.config.registry import Strategy, register

SCHEDULES = ("gpipe", "1f1b")
BALANCE = ("count", "cost")


@dataclass(kw_only=True, frozen=True)
class HybridOptions:
    """The grid and how each axis works (``labkit run hybrid --dp 2 --pp 2 --tp 2``)."""

    dp: int | None = option(None, integer(1, example=2, optional=True))
    """Data-parallel replicas D; default: world_size / (pp x tp)."""
    pp: int = option(1, integer(1, 64, example=2))
    """Pipeline stages P."""
    tp: int = option(1, integer(1, 64, example=2))
    """Tensor-parallel ranks T (split each block's heads and MLP columns; gpt only)."""
    schedule: str = option("1f1b", one_of(SCHEDULES, example="1f1b", why=(
        " for hybrid runs (interleaved and zero bubble run with `labkit run pipeline`)")))
    """Pipeline schedule: gpipe or 1f1b."""
    microbatches: int = option(4, integer(1, 4096, example=4))
    """Microbatches M per step (batch_size must be a multiple of M)."""
    zero_stage: int = option(0, one_of((0, 1, 2, 3), example=1))
    """ZeRO stage on the data axis: 0 (all-reduce gradients), 1, 2 or 3."""
    balance: str = option("count", one_of(BALANCE, example="cost"))
    """Blocks per stage: count (equal numbers) or cost (by time measured on rank 0)."""
    cp: int = option(1, integer(1, 64, example=2))
    """Context-parallel ranks C: the sequence split over them, ring attention (gpt only)."""
    ep: int = option(1, integer(1, 64, example=2))
    """Expert-parallel ranks: each MoE layer's experts split over ``ep`` data ranks (1 or dp)."""
    experts: int = option(0, integer(0, 1024, example=4))
    """Experts per MoE layer (0: the dense MLP); every block's MLP becomes an MoE."""
    top_k: int = option(1, integer(1, 64, example=2))
    """Experts each token is routed to (Switch: 1, GShard: 2)."""
    capacity_factor: float = option(1.25, real(0.0, 1024.0, example=1.25))
    """Slots per expert, as a multiple of the even share of the rank's assignments."""
    sequence_parallel: bool = option(False, flag())
    """Split the LayerNorm regions of each TP group along the sequence (Korthikanti et al.
    2022): TP's all-reduces become all-gathers and reduce-scatters; needs tp > 1."""

    def __post_init__(self) -> None:
        problems = check_fields(self)
        if problems:
            raise ConfigError(problems)


def hybrid_grid(config: Any) -> Grid:
    """The run's grid; dp defaults to whatever world_size leaves after pp x tp."""
    o = config.options
    dp = o.dp if o.dp is not None else max(1, config.world_size // (o.pp * o.tp * o.cp))
    return Grid(dp=dp, pp=o.pp, tp=o.tp, cp=o.cp, ep=o.ep if dp % o.ep == 0 else 1)


def check(config: Any) -> list[str]:
    """Rules across fields, before any process starts."""
    o, m, n = config.options, config.model, config.world_size
    grid = hybrid_grid(config)
    problems = []
    if grid.world_size != n:
        dp = "dp" if o.dp is not None else "dp (inferred)"
        cp = f" x cp {o.cp}" if o.cp > 1 else ""
        problems.append(f"world_size ({n}) must equal dp x pp{' x cp' if cp else ''} x tp ({dp} "
                        f"{grid.dp} x pp {o.pp}{cp} x tp {o.tp} = {grid.world_size}); drop "
                        f"--world-size or pick sizes whose product is {n}, e.g. --dp "
                        f"{max(1, n // (o.pp * o.tp * o.cp))} --pp {o.pp} --tp {o.tp}")
    if o.cp > 1 and (m.kind != "gpt" or m.seq_len % (2 * o.cp)):
        problems.append(f"cp ({o.cp}) needs --model gpt and seq_len ({m.seq_len}) a multiple of "
                        f"2 x cp ({2 * o.cp}): each rank holds two zig-zag chunks of the "
                        f"sequence; e.g. --cp 2 --seq-len 64")
    if m.kind == "gpt":
        if m.heads % o.tp or (4 * m.width) % o.tp or m.width % o.tp:
            problems.append(f"tp ({o.tp}) must divide heads ({m.heads}) and width ({m.width}) "
                            f"so every rank gets whole heads and equal MLP columns; e.g. tp=2 "
                            f"with heads=4")
    elif o.tp != 1:
        problems.append(f"tp ({o.tp}) needs --model gpt: tensor parallelism splits a "
                        f"transformer block's heads and MLP columns, and the {m.kind} has no "
                        f"such column/row pair; use --tp 1 or --model gpt")
    if o.sequence_parallel and (o.tp < 2 or m.kind != "gpt" or (m.seq_len // o.cp) % o.tp):
        problems.append(f"sequence_parallel needs --model gpt, tp >= 2 and tp ({o.tp}) "
                        f"dividing the tokens per cp rank (seq_len {m.seq_len} / cp {o.cp}): "
                        f"it splits the sequence over the TP group; e.g. --tp 2 --seq-len 64 "
                        f"--sequence-parallel")
    problems += _expert_problems(o, m.kind, grid.dp)
    if m.kind == "digits":
        problems.append("hybrid runs the gpt or the mlp; use --model gpt or --model mlp")
    if m.depth < o.pp:
        problems.append(f"model.depth ({m.depth}) must be >= pp ({o.pp}): every pipeline stage "
                        f"needs a block; e.g. --depth {o.pp * 2}")
    if config.batch_size % o.microbatches:
        problems.append(f"batch_size ({config.batch_size}) must be a multiple of microbatches "
                        f"({o.microbatches}); e.g. --batch-size "
                        f"{o.microbatches * max(1, config.batch_size // o.microbatches)}")
    return problems


def _expert_problems(o: Any, kind: str, dp: int) -> list[str]:
    if o.experts == 0:
        return [f"ep ({o.ep}) needs --experts: it splits the experts of MoE layers; e.g. "
                f"--experts 4 --ep {o.ep}"] if o.ep > 1 else []
    out = []
    if kind != "gpt" or o.tp > 1:
        out.append(f"experts ({o.experts}) need --model gpt and tp 1 (tp {o.tp}): the MoE "
                   f"layer replaces the GPT's MLP, unsplit; e.g. --model gpt --experts 4")
    if o.ep not in (1, dp) or o.experts % o.ep:
        out.append(f"ep ({o.ep}) must be 1 or dp ({dp}) and divide experts ({o.experts}): "
                   f"experts lie over the data ranks (an ep group smaller than dp would need "
                   f"one more group); e.g. --dp 2 --ep 2 --experts 4")
    if o.top_k > o.experts:
        out.append(f"top_k ({o.top_k}) must be <= experts ({o.experts}); e.g. --top-k 2")
    return out


@dataclass
class HybridMetrics(RankMetrics):
    """One rank of the grid: its coordinates, bytes per axis, model state and spans."""

    pp_rank: int | None = None
    axis_bytes: dict[str, float] | None = None
    """Wire bytes this rank sent per step on each axis (median over steady steps)."""
    model_state_bytes: dict[str, int] | None = None
    params_held: int | None = None
    step_stats: list[tuple[int, int, int]] | None = None
    stage_ms: float | None = None
    """This rank's mean compute per microbatch on its stage (steady steps), ms."""
    stage_bounds: list[int] | None = None
    grid: dict[str, int] | None = None
    zero_stage: int | None = None
    schedule: str | None = None
    microbatches: int | None = None
    ln_activation_bytes: int | None = None
    """Bytes the blocks' LayerNorms on this rank keep for backward, per microbatch."""
    moe_kept_per_step: list[int] | None = None
    """Assignments this rank's routers kept, per step (MoE runs)."""
    moe_calls_per_step: list[int] | None = None
    moe_tokens_per_expert: list[int] | None = None
    """Step 0: assignments routed to each expert by this rank's tokens, all layers summed."""
    moe_dropped: int | None = None
    moe_aux_loss: list[float] | None = None

    REPORTED: ClassVar[tuple[str, ...]] = ("bubble_fraction", "bubble_fraction_predicted")

    @classmethod
    def report_lines(cls, metrics: dict[str, Any]) -> list[str]:
        from labkit.strategies.hybrid.report import report_lines

        return report_lines(metrics)

    @classmethod
    def combine(cls, records: Sequence[RankMetrics], config: Any) -> dict[str, Any]:
        from labkit.strategies.hybrid.report import summarize

        out = super().combine(records, config)
        for key in ("pp_rank", "axis_bytes", "model_state_bytes", "params_held", "step_stats",
                    "stage_ms", "ln_activation_bytes", "moe_kept_per_step",
                    "moe_calls_per_step", "moe_tokens_per_expert", "moe_dropped", "moe_aux_loss"):
            out.pop(key, None)
        out.update(summarize([r for r in records if isinstance(r, HybridMetrics)], config))
        return out


register(Strategy(
    name="hybrid", entry="labkit.strategies.hybrid.impl:train", options=HybridOptions,
    summary="3D parallel: data x pipeline x tensor on one rank grid, ZeRO on the data axis",
    check=check, lesson="09_3d_parallelism", grid=hybrid_grid,
    default_world_size=lambda o: (o.dp or 1) * o.pp * o.cp * o.tp))
