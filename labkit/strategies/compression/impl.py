"""Rank code of ``labkit run compress``: DDP with a compressing comm hook, bytes traced.

The training loop is torch DDP's (``TorchDDPLoop``); only the hook changes. Metrics: payload
and per-rank wire bytes of every step read from this rank's trace, the prediction from
``cost.py``, and the compression ratio against plain fp32 all-reduce.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from labkit.base.events import Lane, Op
from labkit.rank.context import RankOutput, RunContext
from labkit.strategies.compression import CompressionMetrics
from labkit.strategies.compression.cost import allreduce_wire, predicted_payload_bytes
from labkit.strategies.compression.hooks import (
    Int8Hook,
    RandomKHook,
    TopKHook,
    cast_wrapper,
    traced_allreduce_hook,
    traced_torch_hooks,
)
from labkit.strategies.ddp.torch_ddp import TorchDDPLoop
from labkit.trace.comm import wire_bytes


def bytes_per_step(events: list[Any], world_size: int) -> tuple[list[int], list[float]]:
    """Payload and per-rank wire bytes of every step's gradient exchange (from the trace)."""
    payload: dict[int, int] = defaultdict(int)
    wire: dict[int, float] = defaultdict(float)
    for e in events:
        if e.lane == Lane.COMM and e.op != Op.WAIT and e.step is not None and e.bytes:
            payload[e.step] += e.bytes
            wire[e.step] += wire_bytes(e.op, e.bytes, world_size)
    steps = sorted(payload)
    return [payload[s] for s in steps], [wire[s] for s in steps]


class CompressedDDPLoop(TorchDDPLoop[CompressionMetrics]):
    Record = CompressionMetrics
    wraps_one_replica = True  # the hook changes the gradients (casts, sparsifies) on one rank too

    def __init__(self, ctx: RunContext) -> None:
        self.feedback: TopKHook | RandomKHook | Int8Hook | None = None  # error-feedback hooks
        super().__init__(ctx, ctx.config.options.bucket_cap_mb)

    def register_hook(self, ddp: DistributedDataParallel) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        opts, comm = self.cfg.options, self.hook_comm
        plain = traced_allreduce_hook(comm, self.step_ref)
        if opts.method == "none":
            ddp.register_comm_hook(None, plain)
        elif opts.method == "fp16":
            ddp.register_comm_hook(None, default_hooks.fp16_compress_wrapper(plain))
        elif opts.method == "bf16":
            ddp.register_comm_hook(None, cast_wrapper(plain, torch.bfloat16))
        elif opts.method == "powersgd":
            state = powerSGD_hook.PowerSGDState(
                process_group=None, matrix_approximation_rank=opts.rank,
                start_powerSGD_iter=opts.powersgd_start_step, use_error_feedback=True,
                warm_start=True)
            ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        elif opts.method == "topk":
            self.feedback = TopKHook(comm, self.ctx.tracer, self.step_ref, opts.topk_ratio)
            ddp.register_comm_hook(None, self.feedback.__call__)
        elif opts.method == "randomk":
            self.feedback = RandomKHook(comm, self.ctx.tracer, self.step_ref, opts.randomk_ratio)
            ddp.register_comm_hook(None, self.feedback.__call__)
        else:
            self.feedback = Int8Hook(comm, self.ctx.tracer, self.step_ref)
            ddp.register_comm_hook(None, self.feedback.__call__)

    def run(self) -> RankOutput:
        with traced_torch_hooks(self.hook_comm, self.step_ref,
                                on_cpu=self.ctx.device.type == "cpu"):
            return super().run()

    def fill_record(self) -> None:
        super().fill_record()
        # 1. measured bytes per step from the trace; 2. predicted from the shapes
        opts, n, rec = self.cfg.options, self.ctx.world_size, self.record
        payload, wire = bytes_per_step(self.ctx.events(), n)
        model = self.full_model
        shapes = [list(p.shape) for p in model.parameters()]
        grad_bytes = sum(p.numel() * 4 for p in model.parameters())
        buckets = list(self.feedback.bucket_numel.values()) if self.feedback is not None else []
        pred = predicted_payload_bytes(opts.method, shapes, n, rank=opts.rank,
                                       bucket_numels=buckets, topk_ratio=opts.topk_ratio,
                                       randomk_ratio=opts.randomk_ratio)
        steady = wire[-1] if wire else 0.0
        rec.method = opts.method
        rec.payload_bytes_per_step, rec.wire_bytes_per_step = payload, wire
        rec.predicted_payload_bytes, rec.predicted_wire_bytes = pred["payload"], pred["wire"]
        rec.uncompressed_wire_bytes = allreduce_wire(grad_bytes, n)
        rec.compression_ratio = allreduce_wire(grad_bytes, n) / steady if steady else 0.0
        rec.grad_bytes = grad_bytes


def train(ctx: RunContext) -> RankOutput:
    return CompressedDDPLoop(ctx).run()
