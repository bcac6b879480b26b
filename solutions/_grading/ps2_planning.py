"""Problem set 2, instructor side: the key of Q1 (computed by labkit.theory)."""

from __future__ import annotations

from labkit import theory

# 3B parameters, mixed-precision Adam, plain data parallelism: every GPU holds everything.
PURE_DP_GB = theory.zero_memory(3e9, 4, 0, "mixed", "adam")["total"] / 1e9
