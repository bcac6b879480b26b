"""Rank code of ``labkit run compress``: DDP with a compressing comm hook, bytes traced.

The training loop is the DDP one (seeded MLP, sharded synthetic batch); only the hook
changes. Metrics: payload and per-rank wire bytes of every step read from this rank's trace,
the prediction from ``cost.py``, and the compression ratio against plain fp32 all-reduce.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from labkit.comm import wire_bytes
from labkit.events import Lane, Op
from labkit.rank import RankContext, RankOutput
from labkit.strategies.compression.cost import allreduce_wire, predicted_payload_bytes
from labkit.strategies.compression.hooks import (
    StepRef,
    TopKHook,
    cast_wrapper,
    traced_allreduce_hook,
    traced_torch_hooks,
)
from labkit.training import (
    BackwardClock,
    build_mlp,
    make_optimizer,
    max_abs_diff,
    params_sha256,
    reference_train,
    task_for,
    traced_backward,
    unwrap_state,
)


def _register(ctx: RankContext, ddp: DistributedDataParallel, opts: Any, step: StepRef) -> Any:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    plain = traced_allreduce_hook(ctx.comm, step)
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
    else:
        hook = TopKHook(ctx.comm, ctx.tracer, step, opts.topk_ratio)
        ddp.register_comm_hook(None, hook.__call__)
        return hook
    return None


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


def train(ctx: RankContext) -> RankOutput:
    cfg = ctx.config
    assert cfg is not None
    opts = cfg.options
    model = build_mlp(cfg.model, cfg.seed).to(ctx.device)
    ddp = DistributedDataParallel(model, bucket_cap_mb=opts.bucket_cap_mb)
    step = StepRef()
    topk = _register(ctx, ddp, opts, step)
    opt = make_optimizer(cfg.optimizer, ddp.parameters(), cfg.lr)
    clock = BackwardClock(ddp.parameters())
    task = task_for(cfg)
    losses = []
    with traced_torch_hooks(ctx.comm, step):
        for s in range(cfg.steps):
            with ctx.step(s):
                step.now = s
                x, y = task.batch(s, cfg.batch_size * ctx.world_size, ctx.rank, ctx.world_size)
                opt.zero_grad(set_to_none=True)
                with ctx.tracer.span(Op.FORWARD, step=s):
                    loss = nn.functional.cross_entropy(ddp(x), y)
                traced_backward(ctx, loss, clock, s)
                with ctx.tracer.span(Op.OPTIMIZER, step=s):
                    opt.step()
                losses.append(loss.item())
    # 1. measured bytes per step from the trace; 2. predicted from the shapes
    payload, wire = bytes_per_step(ctx.events(), ctx.world_size)
    shapes = [list(p.shape) for p in model.parameters()]
    grad_bytes = sum(p.numel() * 4 for p in model.parameters())
    buckets = list(topk.bucket_numel.values()) if topk is not None else []  # DDP's layout
    pred = predicted_payload_bytes(opts.method, shapes, ctx.world_size, rank=opts.rank,
                                   bucket_numels=buckets, topk_ratio=opts.topk_ratio)
    steady = wire[-1] if wire else 0.0
    metrics: dict[str, Any] = {
        "method": opts.method, "payload_bytes_per_step": payload, "wire_bytes_per_step": wire,
        "predicted_payload_bytes": pred["payload"], "predicted_wire_bytes": pred["wire"],
        "uncompressed_wire_bytes": allreduce_wire(grad_bytes, ctx.world_size),
        "compression_ratio": allreduce_wire(grad_bytes, ctx.world_size) / steady if steady else 0.0,
        "grad_bytes": grad_bytes, "num_params": sum(p.numel() for p in model.parameters())}
    out = RankOutput(losses=losses, metrics=metrics)
    if ctx.rank == 0:
        state = unwrap_state(ddp)
        out.params_sha256 = params_sha256(state.items())
        if cfg.check_reference:
            metrics["max_abs_diff_vs_reference"] = max_abs_diff(
                state, reference_train(cfg, ctx.world_size))
    return out

