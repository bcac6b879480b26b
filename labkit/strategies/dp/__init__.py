"""Hand-written data parallelism (lesson 01).

Two strategies share one training loop (``loop.py``) and differ only in how gradients are
averaged across ranks:

* ``ddp-naive``: after backward, one blocking all-reduce per parameter. Correct, but no
  communication overlaps compute and many small messages each pay the latency.
* ``ddp-bucketed``: our own ``Bucket`` / ``BucketManager`` (``buckets.py``). Gradients are
  packed, in reverse parameter order, into buckets of about ``bucket_cap_mb``; a bucket's
  async all-reduce is launched from a post-accumulate-grad hook the moment its last
  gradient arrives, while backward keeps computing earlier layers (the design of PyTorch
  DDP; Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel
  Training").

The third variant of the lesson is torch's own ``ddp`` (``labkit.strategies.ddp``).

The options, metrics record and registration live in ``options`` (torch-free); this package
re-exports them.
"""

from labkit.strategies.dp.options import (
    BucketedOptions,
    DPMetrics,
)

__all__ = ["BucketedOptions", "DPMetrics"]
