"""How big each self-test run is, on a CPU and on a GPU.

A check proves a lesson's point only when the run is heavy enough for the effect to beat
the noise: a pipeline bubble follows ``(p-1)/(m+p-1)`` once each action computes for tens of
milliseconds (docs/benchmarks.md, lesson 03), overlap needs backward to outlast an
all-reduce, MFU needs a compute-bound step. On 2 CPU cores the sizes below are the lessons'
bench sizes, measured here (the whole self-test stays about a minute). On a GPU, fixed sizes
would finish in microseconds, so each batch is chosen from the GPU's measured peak for a
step of about ``GPU_STEP_S`` (6 FLOPs per weight per sample: Kaplan et al. 2020).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GPU_STEP_S = 0.05
"""Target compute per GPU per step: tens of milliseconds, far above launch latency (~10 us)."""


@dataclass(frozen=True)
class Run:
    """One ``labkit.run`` of the self-test: the model, the batch per rank, the steps."""

    model: dict[str, Any]
    batch_size: int
    steps: int
    options: dict[str, Any] = field(default_factory=dict)

    def kwargs(self) -> dict[str, Any]:
        return {"model": dict(self.model), "batch_size": self.batch_size, "steps": self.steps,
                "options": dict(self.options) or None}


@dataclass(frozen=True)
class Sizes:
    """Every run's size for one kind of machine."""

    device: str
    ddp: Run
    ring_bytes: int
    ring_iters: int
    bucketed: Run
    pipeline: Run
    zero: Run
    tp: Run
    mfu: Run


def mlp_weights(in_dim: int, width: int, depth: int, out_dim: int = 10) -> int:
    """Matmul weights of labkit's MLP (biases do no matmul): in x w, (depth-1) w x w, w x out."""
    return in_dim * width + (depth - 1) * width * width + width * out_dim


def batch_for(weights: float, peak_flops: float, step_s: float = GPU_STEP_S, lo: int = 64,
              hi: int = 16384) -> int:
    """The power-of-two batch whose training step (6 x weights x batch FLOPs) takes about
    ``step_s`` at ``peak_flops``, clamped to [lo, hi]."""
    want = step_s * peak_flops / (6 * weights)
    batch = lo
    while batch * 2 <= min(want, hi):
        batch *= 2
    return batch


def cpu_sizes() -> Sizes:
    return Sizes(
        device="cpu",
        ddp=Run({"kind": "mlp"}, 32, 10),
        ring_bytes=16_000_000, ring_iters=20,  # big enough that a stall is a small share
        bucketed=Run({"width": 1024, "depth": 8}, 64, 12, {"bucket_cap_mb": 4.0}),
        pipeline=Run({"width": 1024, "depth": 16, "in_dim": 1024}, 1024, 5, {"microbatches": 4}),
        zero=Run({"width": 513, "depth": 3}, 32, 3),  # odd width: the padding is exercised
        tp=Run({"kind": "mlp"}, 32, 10, {}),
        mfu=Run({"width": 1024, "depth": 8}, 256, 6))


def gpu_sizes(peak_flops: float) -> Sizes:
    """Sizes for one GPU per rank whose fp32 matmul peak is ``peak_flops``."""
    def mlp(width: int, depth: int, in_dim: int = 32, share: int = 1) -> tuple[dict[str, Any], int]:
        weights = mlp_weights(in_dim, width, depth) / share  # a stage holds 1/share of them
        return ({"width": width, "depth": depth, "in_dim": in_dim},
                batch_for(weights, peak_flops))

    ddp_model, ddp_batch = mlp(4096, 4)
    bucketed_model, bucketed_batch = mlp(4096, 8)
    pipe_model, pipe_batch = mlp(4096, 12, in_dim=4096, share=2)  # <= 250M weights
    zero_model, zero_batch = mlp(4096, 8)
    mfu_model, mfu_batch = mlp(8192, 4)
    hidden, seq, layers = 2048, 512, 4
    tp_weights = 12 * hidden * hidden * layers * seq / 2  # per sample and rank: 12 h^2 a token
    return Sizes(
        device="gpu",
        ddp=Run(ddp_model, ddp_batch, 10),
        ring_bytes=256_000_000, ring_iters=20,  # nccl-tests' large-message regime
        bucketed=Run(bucketed_model, bucketed_batch, 12, {"bucket_cap_mb": 25.0}),
        pipeline=Run(pipe_model, max(pipe_batch, 256), 5, {"microbatches": 4}),
        zero=Run(zero_model, zero_batch, 3),
        tp=Run({"kind": "mlp"}, batch_for(tp_weights, peak_flops, lo=8, hi=256), 10,
               {"hidden": hidden, "heads": 16, "seq": seq, "layers": layers}),
        mfu=Run(mfu_model, mfu_batch, 6))
