"""3D parallelism (lesson 09): data x pipeline x tensor parallel on one rank grid, ZeRO on DP.

``labkit run hybrid --dp D --pp P --tp T --model gpt`` lays ``D x P x T`` ranks on the grid
of ``labkit.base.grid`` (tp fastest, so a tensor-parallel group is a run of neighbouring ranks,
i.e. sits inside a node) and trains the GPT with all three at once, as Megatron-LM does
(Narayanan et al. 2021): every tensor-parallel group splits each block's matrices, every
pipeline runs its stages on a GPipe or 1F1B plan, and the data-parallel replicas average
their gradients — or, with ``--zero-stage 1..3``, shard optimizer state, gradients and
parameters across the data axis (Rajbhandari et al. 2020). The result equals one process
on the global batch (``--check-reference``), and every axis's traffic is read off the trace
beside ``labkit.theory.parallel_layout``'s prediction.

The options, metrics record and registration live in ``options`` (torch-free); this package
re-exports them.
"""

from labkit.strategies.hybrid.options import (
    BALANCE,
    SCHEDULES,
    HybridMetrics,
    HybridOptions,
    check,
    hybrid_grid,
)

__all__ = ["BALANCE", "SCHEDULES", "HybridMetrics", "HybridOptions", "check", "hybrid_grid"]
