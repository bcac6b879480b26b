"""ZeRO's settings, metrics record and registration (``labkit.strategies.zero``).

Torch-free: discovery imports this (through the package) in the supervisor, which validates a
config and builds the CLI flags from it before any process starts; the rank code lives in the
sibling modules and is imported only inside the ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from labkit.base.errors import ConfigError
from labkit.base.validate import check_fields, flag, integer, one_of, option
from labkit.config.metrics import RankMetrics
from labkit.config.registry import Strategy, register

STAGES = (0, 1, 2, 3)
TERMS = ("params", "grads", "optimizer")
IMPLS = ("labkit", "torch")
PRECISIONS = ("fp32", "bf16")
TORCH_STAGES = {1: "ZeroRedundancyOptimizer", 3: "FSDP2 fully_shard"}
"""The stages torch itself implements (``--impl torch``), by the class that does it."""


@dataclass(kw_only=True, frozen=True)
class ZeroOptions:
    """Settings of a ZeRO run (``labkit run zero --stage 2 --precision bf16``)."""

    stage: int = option(1, one_of(STAGES, example=2,
                                  why=" (ZeRO has three stages; 0 is plain data parallelism)"))
    """ZeRO stage: 0 none (DDP), 1 optimizer state, 2 + gradients, 3 + parameters sharded."""
    impl: str = option("labkit", one_of(IMPLS, example="labkit"))
    """labkit (ours, every collective on the timeline) or torch (ZeroRedundancyOptimizer for
    stage 1, FSDP2 fully_shard for stage 3)."""
    precision: str = option("fp32", one_of(PRECISIONS, example="bf16"))
    """fp32, or bf16: bf16 working weights and gradients under CPU autocast, fp32 master
    weights and optimizer state (the ZeRO paper's mixed precision, K = 12 for Adam)."""
    checkpointing: bool = option(False, flag())
    """Recompute the hidden Linear+ReLU blocks in backward (torch.utils.checkpoint)."""
    checkpoint_segment: int = option(2, integer(1, example=2))
    """Hidden blocks per checkpointed segment; only segment inputs are saved (>= 1)."""
    pad: bool = option(True, flag())
    """Pad each layer's flat buffer to a multiple of world_size so shards are equal; with
    --no-pad every layer's parameter count must divide by world_size."""

    def __post_init__(self) -> None:
        problems = check_fields(self)
        if not problems and self.impl == "torch":
            if self.stage not in TORCH_STAGES:
                has = " and ".join(f"stage {s} ({cls})" for s, cls in TORCH_STAGES.items())
                others = " and ".join(str(s) for s in STAGES if s not in TORCH_STAGES)
                problems.append(f"impl 'torch' has {has}, not stage {self.stage}; use --impl "
                                f"labkit for stages {others}, e.g. --stage 1 --impl torch")
            problems += labkit_mlp_only(self, "impl 'torch'")
        if problems:
            raise ConfigError(problems)


def labkit_mlp_only(opts: ZeroOptions, used: str) -> list[str]:
    """The features only labkit's own ZeRO of the MLP has -- mixed precision and activation
    checkpointing -- each asked for alongside ``used`` (``impl 'torch'``, ``--model gpt``)."""
    problems = []
    if opts.precision != "fp32":
        problems.append(f"precision {opts.precision!r} is implemented by --impl labkit for the "
                        f"MLP; {used} runs in fp32 here; e.g. --precision fp32")
    if opts.checkpointing:
        problems.append(f"checkpointing (segments of the MLP's Linear+ReLU blocks) is "
                        f"implemented by --impl labkit for the MLP; drop --checkpointing with "
                        f"{used}")
    return problems


PER_RANK = {"model_state_bytes": "per_rank_bytes", "padding": "padding_bytes",
            "peak_model_state": "peak_model_state_bytes",
            "saved_activations": "saved_activation_bytes"}
"""Record fields measured per rank -> the run metric listing them by rank."""


@dataclass
class ZeroMetrics(RankMetrics):
    """A ZeRO rank's model-state bytes as counted from the storages it keeps, the bytes
    it put on the wire, and the calculator's numbers for the same run."""

    zero_stage: int | None = None
    impl: str | None = None
    precision: str | None = None
    checkpointing: bool | None = None
    model_state_bytes: dict[str, int] | None = None
    """This rank's bytes per term (params, grads, optimizer), distinct storages."""
    padding: dict[str, int] | None = None
    """Of those, the zero padding that makes shards equal."""
    peak_model_state: int | None = None
    """Persistent model state + the largest transient buffers inside a step."""
    saved_activations: int | None = None
    """Bytes autograd saved for backward in the last step."""
    predicted_bytes: dict[str, float] | None = None
    padding_elements: int | None = None
    bytes_per_param: dict[str, float] | None = None
    theory_precision: str | None = None
    predicted_activation_bytes: float | None = None
    comm_bytes_per_step: float | None = None
    comm_payload_bytes_per_step: float | None = None
    predicted_comm_bytes_per_step: float | None = None
    ddp_comm_bytes_per_step: float | None = None
    comm_ratio_vs_ddp: float | None = None
    untraced_broadcast_payload_bytes: int | None = None

    REPORTED: ClassVar[tuple[str, ...]] = (
        "zero_stage", "impl", "precision", "comm_bytes_per_step",
        "predicted_comm_bytes_per_step", "ddp_comm_bytes_per_step", "comm_ratio_vs_ddp")

    @classmethod
    def report_lines(cls, metrics: dict[str, Any]) -> list[str]:
        from labkit.analysis.report import mb, table

        m = metrics
        if "per_rank_bytes" not in m:
            return []
        pred = m["predicted_bytes"]
        lines = [f"  ZeRO stage {m['zero_stage']} ({m['impl']}, {m['precision']}): model state "
                 f"per rank, MB, measured (predicted by labkit.theory.zero_memory)"]
        rows = [[str(r)] + [f"{mb(got[t])} ({mb(pred[t])})" for t in TERMS]
                for r, got in enumerate(m["per_rank_bytes"])]
        lines += table(["rank", *TERMS], rows)
        lines.append(f"  comm          {mb(m['comm_bytes_per_step'])} MB/step on the wire per rank "
                     f"(predicted {mb(m['predicted_comm_bytes_per_step'])}), "
                     f"{m['comm_ratio_vs_ddp']:.3f}x DDP")
        return lines

    @classmethod
    def combine(cls, records: Sequence[RankMetrics], config: Any) -> dict[str, Any]:
        out = super().combine(records, config)
        for field, metric in PER_RANK.items():
            out.pop(field, None)
            values = [getattr(r, field) for r in records]
            if any(v is not None for v in values):
                out[metric] = values
        return out


def layer_sizes(model: Any) -> list[int]:
    """Parameter count of each Linear layer of ``labkit.train.training.build_mlp`` (weight + bias)."""
    in_dim, out_dim = (64, 10) if model.kind == "digits" else (model.in_dim, model.out_dim)
    widths = [in_dim] + [model.width] * model.depth + [out_dim]
    return [a * b + b for a, b in zip(widths[:-1], widths[1:])]


def _gpt_problems(opts: ZeroOptions) -> list[str]:
    """What our ZeRO does for the MLP only: the GPT runs fp32, padded, ours."""
    problems = labkit_mlp_only(opts, "--model gpt")
    if opts.impl != "labkit":
        problems.append("--model gpt runs with --impl labkit (torch's FSDP2 is set up for the "
                        "MLP's Linear layers here); e.g. labkit run zero --model gpt --stage 3")
    if not opts.pad:
        problems.append("--no-pad needs every sharded unit to divide by world_size; the GPT's "
                        "LayerNorms and biases rarely do: keep --pad with --model gpt")
    return problems


def _check(config: Any) -> list[str]:
    """Rules across fields: without padding every layer must split evenly over the ranks."""
    opts, n = config.options, config.world_size
    if config.model.kind == "gpt":
        return _gpt_problems(opts)
    if opts.pad or opts.stage == 0:
        return []
    bad = [(i, size) for i, size in enumerate(layer_sizes(config.model)) if size % n]
    if not bad:
        return []
    listed = ", ".join(f"layer {i} has {size}" for i, size in bad)
    return [f"with --no-pad every layer's parameter count must be divisible by world_size "
            f"({n}), but {listed} (remainder {bad[0][1] % n}); keep padding on (--pad) or "
            f"pick sizes that divide, e.g. --world-size 2 with even widths"]


register(Strategy(
    name="zero", entry="labkit.strategies.zero.impl:train", options=ZeroOptions,
    summary="ZeRO stages 0-3 (ours, traced) or torch's ZeroRedundancyOptimizer / FSDP2; "
            "per-rank model-state bytes measured vs predicted",
    check=_check, lesson="05_memory_and_zero",
    defaults={"optimizer": "adam", "lr": 0.01}))  # Adam's state is what ZeRO shards
