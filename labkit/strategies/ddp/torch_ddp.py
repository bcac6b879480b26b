"""Torch's DistributedDataParallel, with every bucket all-reduce on the timeline.

DDP groups gradients into buckets (in reverse order of the parameters, which is roughly
the order backward produces them) and all-reduces a bucket as soon as it is full, while
backward keeps computing earlier layers. A comm hook (``register_comm_hook``) routes each
bucket's all-reduce through labkit's traced comm layer, so the overlap shows up as comm
spans that sit under the backward compute span.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from labkit.checkpoint import Checkpointer
from labkit.events import Op
from labkit.rank import RankContext, RankOutput
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


def _traced_allreduce_hook(ctx: RankContext) -> Any:
    step: dict[str, Any] = {"now": 0, "buckets": set()}

    # no annotations: DDP rejects a hook whose ``bucket`` annotation is not dist.GradBucket,
    # and this module's annotations are strings (``from __future__ import annotations``)
    def hook(_state, bucket):  # type: ignore[no-untyped-def]
        buf = bucket.buffer()
        step["buckets"].add(bucket.index())
        handle = ctx.comm.all_reduce(buf, async_op=True, step=step["now"], bucket=bucket.index())
        world = ctx.world_size
        return handle.future().then(lambda fut: fut.value()[0].div_(world))

    return hook, step


def train(ctx: RankContext) -> RankOutput:
    cfg = ctx.config
    assert cfg is not None
    opts = cfg.options
    model = build_mlp(cfg.model, cfg.seed).to(ctx.device)
    ddp = DistributedDataParallel(model, bucket_cap_mb=opts.bucket_cap_mb,
                                  device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None)
    hook, hook_step = _traced_allreduce_hook(ctx)
    ddp.register_comm_hook(None, hook)
    opt = make_optimizer(cfg.optimizer, ddp.parameters(), cfg.lr)
    clock = BackwardClock(ddp.parameters())
    task = task_for(cfg)
    tr = ctx.tracer
    ckpt = Checkpointer(ctx, opts.checkpoint_dir, opts.checkpoint_every, opts.resume, model, opt)
    start, losses = ckpt.start()
    for step in range(start, cfg.steps):
        with ctx.step(step):
            hook_step["now"] = step
            x, y = task.batch(step, cfg.batch_size * ctx.world_size, ctx.rank, ctx.world_size)
            x, y = x.to(ctx.device), y.to(ctx.device)
            opt.zero_grad(set_to_none=True)
            with tr.span(Op.FORWARD, step=step):
                loss = nn.functional.cross_entropy(ddp(x), y)
            traced_backward(ctx, loss, clock, step)
            with tr.span(Op.OPTIMIZER, step=step):
                opt.step()
            losses.append(loss.item())
        ckpt.after_step(step, losses)
    state = unwrap_state(ddp)
    out = RankOutput(losses=losses)
    num_buckets = len(hook_step["buckets"])
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    out.metrics.update(bytes_per_step=grad_bytes, buckets=num_buckets,
                       num_params=sum(p.numel() for p in model.parameters()))
    if opts.checkpoint_dir:
        out.metrics.update(ckpt.metrics())
    if ctx.rank == 0:
        out.params_sha256 = params_sha256(state.items())
        if cfg.check_reference:
            out.metrics["max_abs_diff_vs_reference"] = max_abs_diff(
                state, reference_train(cfg, ctx.world_size))
    return out
