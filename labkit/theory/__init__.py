"""Pure calculators: the "prediction" every lesson shows next to a measured run.

Nothing here starts a process or imports torch, so it is instant to import and safe to
call from a quiz, a grader or the CLI. Modules:

* ``batch``: global batch, LR scaling rules, warmup and decay schedules (Goyal et al. 2017)
* ``noise_scale``: the gradient noise scale, the critical batch and where linear LR
  scaling stops (McCandlish et al. 2018)
* ``memory``: bytes per parameter, ZeRO stages, "does it fit?" (Rajbhandari et al. 2020)
* ``activations``: activation memory per transformer layer with tensor / sequence
  parallelism and recomputation (Korthikanti et al. 2022), and its MLP analogue
* ``pipeline``: bubble fraction, activation memory of GPipe vs 1F1B, stage balance
  (Huang et al. 2019; Narayanan et al. 2021)
* ``comm``: ring all-reduce bytes and time, algbw/busbw (nccl-tests), alpha-beta fits,
  Amdahl and scaling efficiency
* ``interconnect``: link presets and per-strategy step-time predictions
* ``checkpointing``: the checkpoint interval that minimizes lost work (Young 1974; Daly 2006)
* ``compute``: model FLOPs of a training step (the numerator of MFU)
* ``context``: context parallelism: ring attention's memory per rank, bytes per rank,
  overlap condition and zig-zag balance (Liu et al. 2023; Korthikanti et al. 2022)
* ``experts``: mixture of experts: capacity, dropped tokens, load imbalance, the
  all-to-all bytes of expert parallelism, MoE parameters (Fedus et al. 2021; Lepikhin et
  al. 2020)
* ``parallel3d``: per-rank parameters, memory and per-axis traffic of a dp x pp x tp grid
* ``deepspeed``: a DeepSpeed ZeRO config read field by field, with labkit's predictions
* ``roofline``: when data parallelism turns communication-bound (compute vs all-reduce
  per step as the batch per device grows; the crossover batch on a GPU node)
* ``rounding``: how far float rounding alone moves weights (the lab's tolerance for "equals
  one process")
* ``plan``, ``plan_models``, ``plan_terms``: the planner: memory, step time and MFU of every
  layout of a model on a cluster, term by term, checked against published runs
* ``cli``: the ``labkit calc`` command; ``plan_cli``: ``labkit plan``
"""

from __future__ import annotations

from labkit.theory.activations import (
    GPT_3B,
    TransformerShape,
    cross_entropy_saved_bytes,
    layer_activation_bytes,
    layer_norm_activation_bytes,
    mlp_activation_bytes,
    mlp_saved_tensors,
    mlp_step_activation_bytes,
    model_activation_bytes,
    transformer_activation_bytes,
)
from labkit.theory.batch import (
    accumulation_after_resize,
    global_batch,
    lars_local_lr,
    lr_after_resize,
    lr_at_step,
    lr_schedule,
    scaled_lr,
    warmup_lr,
)
from labkit.theory.checkpointing import (
    daly_interval,
    expected_wall_time,
    steps_redone,
    waste_fraction,
    young_interval,
    young_waste_fraction,
)
from labkit.theory.comm import (
    AlphaBeta,
    algbw,
    alpha_beta_time,
    amdahl_fraction_for,
    amdahl_speedup,
    busbw,
    dp_speedup,
    fit_alpha_beta,
    fit_amdahl,
    hierarchical_allreduce_bytes,
    naive_allreduce_bytes,
    ring_allreduce_bytes,
    ring_allreduce_steps,
    ring_allreduce_time,
    scaling_efficiency,
)
from labkit.theory.compute import training_flops
from labkit.theory.context import (
    RingOverlap,
    attention_activation_bytes,
    attention_score_bytes,
    blocks_per_step,
    chunk_owner,
    min_block_tokens,
    rank_chunks,
    ring_attention_traffic,
    ring_kv_block_bytes,
    ring_overlap,
    ring_step_flops,
    score_blocks_per_rank,
    unmasked_scores_per_rank,
)
from labkit.theory.deepspeed import FieldMapping, deepspeed_plan, plan_text
from labkit.theory.experts import (
    active_params_per_token,
    combine_bytes,
    counts_bytes,
    dispatch_bytes,
    dropped_tokens,
    expert_capacity,
    kept_per_expert,
    load_imbalance,
    mlp_params,
    moe_params,
    tokens_between_ranks,
)
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
    zero_comm_volume,
    zero_memory,
    zero_offload_traffic,
)
from labkit.theory.noise_scale import (
    examples_needed,
    optimal_lr,
    simple_noise_scale,
    steps_needed,
    trace_sigma,
    true_grad_sq,
)
from labkit.theory.parallel3d import Layout3D, gpt_params, parallel_layout
from labkit.theory.pipeline import (
    bubble_fraction,
    ideal_pipeline_speedup,
    pipeline_peak_activations,
    pipeline_speedup,
    stage_balance_speedup,
    uneven_bubble_fraction,
)
from labkit.theory.plan import plan as plan_layouts
from labkit.theory.plan import predict as predict_layout
from labkit.theory.plan_models import GPUS, MODELS, Decoder, Training, cluster
from labkit.theory.roofline import (
    ACCELERATORS,
    dp_allreduce_time,
    dp_compute_time,
    dp_crossover_batch,
    dp_roofline,
    node_crossover,
)
from labkit.theory.rounding import rounding_text, same_weights_tolerance

__all__ = [
    "GPUS",
    "MODELS",
    "Decoder",
    "Training",
    "cluster",
    "predict_layout",
    "ACCELERATORS",
    "GPT_3B",
    "INTERCONNECTS",
    "AlphaBeta",
    "FieldMapping",
    "FitReport",
    "Interconnect",
    "Layout3D",
    "RingOverlap",
    "StepPrediction",
    "TransformerShape",
    "accumulation_after_resize",
    "active_params_per_token",
    "algbw",
    "amdahl_fraction_for",
    "amdahl_speedup",
    "attention_activation_bytes",
    "attention_score_bytes",
    "blocks_per_step",
    "bubble_fraction",
    "busbw",
    "bytes_per_param",
    "chunk_owner",
    "combine_bytes",
    "counts_bytes",
    "cross_entropy_saved_bytes",
    "daly_interval",
    "deepspeed_plan",
    "dispatch_bytes",
    "dp_allreduce_time",
    "dp_compute_time",
    "dp_crossover_batch",
    "dp_roofline",
    "dp_speedup",
    "dropped_tokens",
    "examples_needed",
    "expected_wall_time",
    "expert_capacity",
    "fit_alpha_beta",
    "fit_amdahl",
    "fits",
    "get_link",
    "global_batch",
    "gpt_params",
    "hierarchical_allreduce_bytes",
    "ideal_pipeline_speedup",
    "kept_per_expert",
    "lars_local_lr",
    "layer_activation_bytes",
    "layer_norm_activation_bytes",
    "load_imbalance",
    "lr_after_resize",
    "lr_at_step",
    "lr_schedule",
    "min_block_tokens",
    "mlp_activation_bytes",
    "mlp_params",
    "mlp_saved_tensors",
    "mlp_step_activation_bytes",
    "model_activation_bytes",
    "moe_params",
    "naive_allreduce_bytes",
    "node_crossover",
    "optimal_lr",
    "parallel_layout",
    "pipeline_peak_activations",
    "pipeline_speedup",
    "plan_layouts",
    "plan_text",
    "predict_step_time",
    "rank_chunks",
    "ring_allreduce_bytes",
    "ring_allreduce_steps",
    "ring_allreduce_time",
    "alpha_beta_time",
    "ring_attention_traffic",
    "ring_kv_block_bytes",
    "ring_overlap",
    "ring_step_flops",
    "rounding_text",
    "same_weights_tolerance",
    "scaled_lr",
    "scaling_efficiency",
    "score_blocks_per_rank",
    "simple_noise_scale",
    "stage_balance_speedup",
    "steps_needed",
    "steps_redone",
    "this_machine",
    "tokens_between_ranks",
    "trace_sigma",
    "training_flops",
    "transformer_activation_bytes",
    "true_grad_sq",
    "uneven_bubble_fraction",
    "unmasked_scores_per_rank",
    "warmup_lr",
    "waste_fraction",
    "young_interval",
    "young_waste_fraction",
    "zero_comm_volume",
    "zero_memory",
    "zero_offload_traffic",
]
