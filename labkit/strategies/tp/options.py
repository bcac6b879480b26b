"""Tensor parallelism's settings, metrics record and registration (``labkit.strategies.tp``).

Torch-free: discovery imports this (through the package) in the supervisor, which validates a
config and builds the CLI flags from it before any process starts; the rank code lives in the
sibling modules and is imported only inside the ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labkit.base.errors import ConfigError
from labkit.base.validate import check_fields, flag, integer, one_of, option
from labkit.config.metrics import RankMetrics
from labkit.config.registry import Strategy, register

BLOCKS = ("both", "mlp", "attention")


@dataclass(kw_only=True, frozen=True)
class TPOptions:
    """Shape of the tensor-parallel model (the batch size is ``RunConfig.batch_size``)."""

    hidden: int = option(256, integer(1, 65_536, example=256))
    """Hidden size h of the activations (b, s, h)."""
    ffn_mult: int = option(4, integer(1, 64, example=4))
    """MLP inner width as a multiple of hidden (Megatron uses 4)."""
    heads: int = option(8, integer(1, 65_536, example=8))
    """Attention heads; they are split evenly across the ranks."""
    seq: int = option(16, integer(1, 65_536, example=16))
    """Sequence length s (tokens per sample)."""
    layers: int = option(2, integer(1, 256, example=2))
    """Number of blocks (each: attention then MLP, as chosen by ``block``)."""
    block: str = option("both", one_of(BLOCKS, example="both"))
    """What one layer holds: both (attention + MLP), mlp or attention."""
    dtensor_check: bool = option(False, flag())
    """Also run torch's DTensor parallelize_module (Colwise/Rowwise) on the MLP as a cross-check."""

    def __post_init__(self) -> None:
        problems = check_fields(self)
        if not problems and self.hidden % self.heads:
            problems.append(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads}) "
                            "so every head has the same size; e.g. hidden=256, heads=8")
        if problems:
            raise ConfigError(problems)


@dataclass
class TPMetrics(RankMetrics):
    """Per layer, the all-reduce bytes this rank's trace holds, beside Megatron's count."""

    comm_bytes_per_layer_measured: list[dict[str, int]] | None = None
    comm_bytes_per_layer_predicted: dict[str, float] | None = None
    comm_bytes_match: bool | None = None
    """Every layer, every step, forward and backward: measured == predicted."""
    activation_bytes: int | None = None
    params_per_rank: int | None = None
    params_full: int | None = None
    dtensor: dict[str, Any] | None = None
    """torch DTensor's own Colwise/Rowwise MLP on the same weights (``--dtensor-check``)."""
    max_abs_diff_output: float | None = None
    max_abs_diff_loss: float | None = None


def check(config: Any) -> list[str]:
    """Rules across fields: the heads and the MLP width must split evenly over the ranks."""
    opts, n, m = config.options, config.world_size, config.model
    if m.kind == "gpt":
        if m.heads % n or m.width % n:
            return [f"model.heads ({m.heads}) and model.width ({m.width}) must be multiples of "
                    f"world_size ({n}) so each rank gets whole heads; e.g. --heads {n * 2}"]
        return []
    if m.kind != "mlp":
        return [f"tp trains its transformer blocks (default) or --model gpt, not "
                f"--model {m.kind}"]
    problems = []
    if opts.block in ("both", "attention") and opts.heads % n:
        problems.append(f"heads ({opts.heads}) must be a multiple of world_size ({n}) so each "
                        f"rank gets whole heads; e.g. heads={n * 2}")
    if opts.block in ("both", "mlp") and (opts.hidden * opts.ffn_mult) % n:
        problems.append(f"hidden*ffn_mult ({opts.hidden * opts.ffn_mult}) must be a multiple of "
                        f"world_size ({n}) to split the MLP columns; e.g. hidden={n * 64}")
    return problems


register(Strategy(
    name="tp", entry="labkit.strategies.tp.impl:train", options=TPOptions, check=check,
    summary="Megatron tensor parallel attention + MLP (f/g operators) vs the unsharded model",
    lesson="04_tensor_parallelism", axis="tp",
    model_entries={"gpt": "labkit.strategies.hybrid.impl:train"}))
