"""Collective benchmarks (lessons 01 and 06).

``labkit run allreduce-bench --impl ring --sizes 4KB 1MB 4MB`` times an all-reduce of each
size on real ranks (``--impl hierarchical --nodes 2`` across emulated nodes, lesson 10),
the way NVIDIA's nccl-tests does (``doc/PERFORMANCE.md``): algorithm
bandwidth = size / time and bus bandwidth = algbw x 2(n-1)/n. ``impl`` picks our
hand-written ring on point-to-point ops (``ring.py``) or the backend's built-in all-reduce.
Sizes use decimal units (1 KB = 1000 bytes, 1 MB = 1e6) unless written KiB / MiB / GiB.

The options, metrics record and registration live in ``options`` (torch-free); this package
re-exports them.
"""

from labkit.strategies.collectives.options import (
    IMPLS,
    MAX_BYTES,
    AllreduceBenchOptions,
    format_size,
    parse_size,
)

__all__ = ["AllreduceBenchOptions", "IMPLS", "MAX_BYTES", "format_size", "parse_size"]
