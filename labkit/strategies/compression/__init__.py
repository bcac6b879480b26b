"""Gradient compression as DDP comm hooks (lesson 06).

``labkit run compress --method powersgd`` trains the seeded MLP with torch's
DistributedDataParallel and replaces each bucket's all-reduce by a compressed exchange:
fp16 / bf16 casts (torch's ``fp16_compress_wrapper`` / ``bf16_compress_wrapper``), PowerSGD
(Vogels et al. 2019, torch's ``powerSGD_hook``) or our top-k sparsification with error
feedback (Stich et al. 2018; Lin et al. 2018, "Deep Gradient Compression"), our random-k
(k positions drawn from a seed every rank shares, so only values travel; Stich et al.
2018) and 8-bit quantisation (a shared scale, int8 values summed in the all-reduce; seed
002's "quantise"). Every byte still goes through ``labkit.trace.comm``, so the bytes on the wire
are read from the trace.

The options, metrics record and registration live in ``options`` (torch-free); this package
re-exports them.
"""

from labkit.strategies.compression.options import (
    METHODS,
    CompressionMetrics,
    CompressionOptions,
)

__all__ = ["CompressionMetrics", "CompressionOptions", "METHODS"]
