"""Pure calculators: the "prediction" every lesson shows next to a measured run.

Nothing here starts a process or imports torch, so it is instant to import and safe to
call from a quiz, a grader or the CLI. Modules:

* ``batch``: global batch, LR scaling rules, warmup and decay schedules (Goyal et al. 2017)
* ``memory``: bytes per parameter, ZeRO stages, activation memory, "does it fit?"
  (Rajbhandari et al. 2020; Korthikanti et al. 2022)
* ``pipeline``: bubble fraction, activation memory of GPipe vs 1F1B, stage balance
  (Huang et al. 2019; Narayanan et al. 2021)
* ``comm``: ring all-reduce bytes and time, algbw/busbw (nccl-tests), alpha-beta fits,
  Amdahl and scaling efficiency
* ``interconnect``: link presets and per-strategy step-time predictions
* ``compute``: model FLOPs of a training step (the numerator of MFU)
* ``parallel3d``: per-rank parameters, memory and per-axis traffic of a dp x pp x tp grid
* ``deepspeed``: a DeepSpeed ZeRO config read field by field, with labkit's predictions
* ``rounding``: how far float rounding alone moves weights (the lab's tolerance for "equals
  one process")
* ``cli``: the ``labkit calc`` command
"""

from __future__ import annotations

from labkit.theory.batch import (
    global_batch,
    lars_local_lr,
    lr_at_step,
    lr_schedule,
    scaled_lr,
    warmup_lr,
)
from labkit.theory.comm import (
    AlphaBeta,
    algbw,
    amdahl_fraction_for,
    amdahl_speedup,
    busbw,
    dp_speedup,
    fit_alpha_beta,
    fit_amdahl,
    hierarchical_allreduce_bytes,
    naive_allreduce_bytes,
    ring_allreduce_bytes,
    ring_allreduce_time,
    scaling_efficiency,
)
from labkit.theory.compute import training_flops
from labkit.theory.deepspeed import FieldMapping, deepspeed_plan, plan_text
from labkit.theory.interconnect import (
    INTERCONNECTS,
    Interconnect,
    StepPrediction,
    get_link,
    predict_step_time,
    this_machine,
)
from labkit.theory.memory import (
    FitReport,
    bytes_per_param,
    fits,
    mlp_activation_bytes,
    mlp_saved_tensors,
    transformer_activation_bytes,
    zero_comm_volume,
    zero_memory,
    zero_offload_traffic,
)
from labkit.theory.parallel3d import Layout3D, gpt_params, parallel_layout
from labkit.theory.pipeline import (
    bubble_fraction,
    ideal_pipeline_speedup,
    pipeline_peak_activations,
    pipeline_speedup,
    stage_balance_speedup,
)
from labkit.theory.rounding import rounding_text, same_weights_tolerance

__all__ = [
    "INTERCONNECTS",
    "AlphaBeta",
    "FieldMapping",
    "FitReport",
    "Layout3D",
    "Interconnect",
    "StepPrediction",
    "algbw",
    "amdahl_fraction_for",
    "amdahl_speedup",
    "bubble_fraction",
    "busbw",
    "bytes_per_param",
    "deepspeed_plan",
    "dp_speedup",
    "fit_alpha_beta",
    "fit_amdahl",
    "fits",
    "get_link",
    "global_batch",
    "gpt_params",
    "hierarchical_allreduce_bytes",
    "ideal_pipeline_speedup",
    "lars_local_lr",
    "lr_at_step",
    "lr_schedule",
    "mlp_activation_bytes",
    "mlp_saved_tensors",
    "naive_allreduce_bytes",
    "parallel_layout",
    "pipeline_peak_activations",
    "pipeline_speedup",
    "plan_text",
    "predict_step_time",
    "ring_allreduce_bytes",
    "ring_allreduce_time",
    "rounding_text",
    "same_weights_tolerance",
    "scaled_lr",
    "scaling_efficiency",
    "stage_balance_speedup",
    "this_machine",
    "training_flops",
    "transformer_activation_bytes",
    "warmup_lr",
    "zero_comm_volume",
    "zero_memory",
    "zero_offload_traffic",
]
