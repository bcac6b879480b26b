"""Scaling the batch (lesson 02): data parallelism with the large-batch toolkit.

Options for the learning-rate scaling rule (none / linear / sqrt, Goyal et al. 2017,
"Accurate, Large Minibatch SGD"), linear warmup, gradient clipping, gradient accumulation
and checkpointing. LARS and LAMB are chosen with the common ``optimizer`` setting; the rank
code is in ``impl``.

The options, metrics record and registration live in ``options`` (torch-free); this package
re-exports them.
"""

from labkit.strategies.scaling.options import (
    DATASET_SAMPLES,
    LR_RULES,
    ScalingMetrics,
    ScalingOptions,
    global_batch_of,
)

__all__ = ["DATASET_SAMPLES", "LR_RULES", "ScalingMetrics", "ScalingOptions", "global_batch_of"]
