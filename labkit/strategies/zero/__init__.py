"""ZeRO stages 0-3 (lesson 05).

Follows Rajbhandari et al. 2020 ("ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models"): stage 1 shards the optimizer state over the data-parallel ranks,
stage 2 also the gradients (reduce-scatter instead of all-reduce), stage 3 also the
parameters (all-gather each layer just before it is used, free it right after). Stage 0
is plain data parallelism with the same code path, the baseline the others are measured
against. ``impl="torch"`` runs torch's own versions for comparison:
``ZeroRedundancyOptimizer`` (stage 1) and FSDP2 ``fully_shard`` (stage 3).

The options, metrics record and registration live in ``options`` (torch-free); this package
re-exports them.
"""

from labkit.strategies.zero.options import (
    IMPLS,
    PER_RANK,
    PRECISIONS,
    STAGES,
    TERMS,
    TORCH_STAGES,
    ZeroMetrics,
    ZeroOptions,
    layer_sizes,
)

__all__ = ["IMPLS", "PER_RANK", "PRECISIONS", "STAGES", "TERMS", "TORCH_STAGES", "ZeroMetrics",
           "ZeroOptions", "layer_sizes"]
