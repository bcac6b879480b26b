"""A DeepSpeed ZeRO config read field by field, in labkit's terms, with the predictions.

Seed 001 shows a ``ds_config.json`` (ZeRO-3, optimizer and parameters offloaded to the CPU,
bf16, ``train_batch_size`` 256 with 4 accumulation steps, launched on 8 GPUs). This module
says what each field is in labkit (the ``zero`` strategy's ``stage``, ``theory.zero_memory``'s
offload terms, the global-batch arithmetic of ``theory.global_batch``) and what the
calculator predicts per GPU, so a student can see what ``offload_optimizer`` would change
before owning the hardware. Field names follow DeepSpeed's configuration documentation.
Pure Python, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from labkit.base.errors import ConfigError
from labkit.theory.batch import check_int, check_number
from labkit.theory.memory import zero_memory, zero_offload_traffic

GB = 1e9


@dataclass(frozen=True)
class FieldMapping:
    """One config field: its value, what it is in labkit, and the prediction it changes."""

    field: str
    value: Any
    labkit: str
    prediction: str


def _offloaded(section: Any) -> bool:
    return isinstance(section, Mapping) and section.get("device", "none") in ("cpu", "nvme")


def deepspeed_plan(config: Mapping[str, Any], *, params: float, gpus: int
                   ) -> list[FieldMapping]:
    """Map a DeepSpeed config onto labkit, with per-GPU predictions for ``params`` on ``gpus``.

    Reads ``zero_optimization.stage``, ``offload_optimizer``, ``offload_param``,
    ``bf16`` / ``fp16``, ``train_batch_size`` and ``gradient_accumulation_steps``.
    """
    psi = check_number("params", params, "params=7.5e9", allow_equal=False)
    n = check_int("gpus", gpus, 1, "gpus=8")
    zero = config.get("zero_optimization", {})
    stage = zero.get("stage", 0) if isinstance(zero, Mapping) else 0
    if stage not in (0, 1, 2, 3):
        raise ConfigError(f"zero_optimization.stage ({stage!r}) must be 0, 1, 2 or 3; "
                          'e.g. {"zero_optimization": {"stage": 3}}')
    off_opt = _offloaded(zero.get("offload_optimizer")) if isinstance(zero, Mapping) else False
    off_par = _offloaded(zero.get("offload_param")) if isinstance(zero, Mapping) else False
    half = any(isinstance(config.get(k), Mapping) and config[k].get("enabled")
               for k in ("bf16", "fp16"))
    precision = "mixed" if half else "fp32"
    plain = zero_memory(psi, n, stage, precision)
    offloaded = zero_memory(psi, n, stage, precision, offload_optimizer=off_opt,
                            offload_params=off_par and stage == 3)
    rows = [
        FieldMapping("zero_optimization.stage", stage,
                     f"labkit run zero --stage {stage}; theory.zero_memory(stage={stage})",
                     f"{plain['total'] / GB:.1f} GB of model states per GPU on {n} GPUs "
                     f"({precision} Adam, no offload)"),
        FieldMapping("zero_optimization.offload_optimizer", off_opt,
                     "theory.zero_memory(offload_optimizer=True) (labkit's zero strategy "
                     "does not offload: prediction only)",
                     (f"moves {plain['optimizer'] / GB:.1f} GB per GPU of optimizer state to "
                      f"host memory and adds {zero_offload_traffic(psi, n, precision) / GB:.2f} "
                      "GB of PCIe traffic per step (gradient shard out, parameter shard back)")
                     if off_opt else "optimizer state stays on the GPU"),
        FieldMapping("zero_optimization.offload_param", off_par,
                     "theory.zero_memory(offload_params=True), ZeRO-3 only",
                     (f"moves the {plain['params'] / GB:.2f} GB parameter shard to the host; "
                      "layers are fetched back before use" if off_par and stage == 3 else
                      "parameters stay on the GPU" if not off_par else
                      "ignored: only ZeRO-3 shards parameters it could move")),
        FieldMapping("bf16.enabled / fp16.enabled", half,
                     "precision='mixed' in theory (2 B weights and grads, 12 B Adam state); "
                     "labkit run zero --precision bf16 (fp32 unless asked)",
                     "16 B per parameter either way: mixed precision saves activations and "
                     "bandwidth, not model states"),
    ]
    batch, accumulation = config.get("train_batch_size"), config.get("gradient_accumulation_steps", 1)
    if batch is not None:
        b = check_int("train_batch_size", batch, 1, "train_batch_size=256")
        acc = check_int("gradient_accumulation_steps", accumulation, 1,
                        "gradient_accumulation_steps=4")
        if b % (acc * n):
            raise ConfigError(f"train_batch_size ({b}) must be a multiple of "
                              f"gradient_accumulation_steps ({acc}) x GPUs ({n}); e.g. "
                              f"train_batch_size={acc * n * max(1, b // (acc * n))}")
        micro = b // (acc * n)
        rows.append(FieldMapping(
            "train_batch_size / gradient_accumulation_steps", f"{b} / {acc}",
            f"labkit run scaling --batch-size {micro} --accumulation {acc} --world-size {n}",
            f"{micro} per GPU x {n} GPUs x {acc} accumulation = {b} samples per step "
            "(theory.global_batch)"))
    rows.append(FieldMapping(
        "total on the GPU", f"{offloaded['total'] / GB:.2f} GB",
        "theory.zero_memory(...)['total'] and ['cpu']",
        f"{offloaded['total'] / GB:.2f} GB per GPU of model states"
        + (f", {offloaded.get('cpu', 0.0) / GB:.2f} GB per GPU on the host" if off_opt or off_par
           else "")))
    return rows


def plan_text(rows: list[FieldMapping]) -> str:
    """The mapping as lines of text (for a notebook or a terminal)."""
    return "\n".join(f"{r.field} = {r.value}\n    labkit: {r.labkit}\n    predicts: {r.prediction}"
                     for r in rows)
