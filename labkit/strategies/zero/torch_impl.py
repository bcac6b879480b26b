"""Torch's own ZeRO, for comparison with ours: ZeroRedundancyOptimizer and FSDP2.

* Stage 1: ``DistributedDataParallel`` all-reduces the gradients (through labkit's traced
  comm hook) and ``torch.distributed.optim.ZeroRedundancyOptimizer`` keeps the Adam state
  of only the parameters this rank owns, then broadcasts the updated ones. It shards by
  whole tensors (greedy by size), so the shards are uneven, unlike our element-wise shards;
  its broadcasts are issued inside torch and are not on the trace (counted separately).
* Stage 3: FSDP2 ``fully_shard`` on every Linear and on the root. Its all-gathers and
  reduce-scatters are routed through labkit's traced comm layer with FSDP2's
  ``set_custom_all_gather`` / ``set_custom_reduce_scatter``, so they are on the timeline.
  On gloo FSDP2 reduce-scatters with SUM and divides by world_size itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from labkit.events import Op
from labkit.rank import RankContext, RankOutput
from labkit.strategies.zero import accounting as acc
from labkit.training import (
    build_mlp,
    make_optimizer,
    max_abs_diff,
    params_sha256,
    reference_train,
    task_for,
)


class _TracedAllGather:
    """FSDP2's all-gather, sent through ``ctx.comm`` (duck-types FSDP2's AllGather)."""

    def __init__(self, ctx: RankContext, clock: dict[str, int]):
        self.ctx, self.clock = ctx, clock

    def allocate(self, size: Sequence[Any], *, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any,
                 async_op: bool = False) -> Any:
        return self.ctx.comm.all_gather(output_tensor, input_tensor, async_op=async_op,
                                        step=self.clock["step"], name="fsdp AG")


class _TracedReduceScatter(_TracedAllGather):
    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,  # type: ignore[override]
                 group: Any, op: Any, async_op: bool = False) -> Any:
        name = "sum" if op == dist.ReduceOp.SUM else "avg"
        return self.ctx.comm.reduce_scatter(output_tensor, input_tensor, op=name,
                                            async_op=async_op, step=self.clock["step"],
                                            name="fsdp RS")


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # DTensor -> this rank's shard


def _wrap(ctx: RankContext, model: nn.Sequential, stage: int) -> tuple[nn.Module, Any, dict]:
    clock = {"step": 0}
    if stage == 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel

        from labkit.strategies.ddp.torch_ddp import _traced_allreduce_hook

        ddp = DistributedDataParallel(model, gradient_as_bucket_view=True)
        hook, hook_step = _traced_allreduce_hook(ctx)
        ddp.register_comm_hook(None, hook)
        cfg = ctx.config
        assert cfg is not None
        optim_cls = type(make_optimizer(cfg.optimizer, [torch.zeros(1)], cfg.lr))
        kwargs = {"momentum": 0.9} if cfg.optimizer == "momentum" else {}
        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=optim_cls, lr=cfg.lr,
                                      **kwargs)  # type: ignore[arg-type]
        return ddp, opt, hook_step
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    units = [fully_shard(m, mesh=mesh) for m in model if isinstance(m, nn.Linear)]
    root = fully_shard(model, mesh=mesh)
    for unit in units + [root]:
        # duck-typed to torch's AllGather / ReduceScatter protocols
        unit.set_custom_all_gather(_TracedAllGather(ctx, clock))  # type: ignore[arg-type]
        unit.set_custom_reduce_scatter(_TracedReduceScatter(ctx, clock))  # type: ignore[arg-type]
    cfg = ctx.config
    assert cfg is not None
    return model, make_optimizer(cfg.optimizer, model.parameters(), cfg.lr), clock


def train_torch(ctx: RankContext) -> RankOutput:
    cfg = ctx.config
    assert cfg is not None
    stage, n = cfg.options.stage, ctx.world_size
    model = build_mlp(cfg.model, cfg.seed)
    num_params = sum(p.numel() for p in model.parameters())
    wrapped, opt, clock = _wrap(ctx, model, stage)
    task, tr, losses = task_for(cfg), ctx.tracer, []
    for step in range(cfg.steps):
        with ctx.step(step):
            clock["now" if stage == 1 else "step"] = step
            x, y = task.batch(step, cfg.batch_size * n, ctx.rank, n)
            opt.zero_grad(set_to_none=False)
            with tr.span(Op.FORWARD, step=step):
                loss = nn.functional.cross_entropy(wrapped(x), y)
            with tr.span(Op.BACKWARD, step=step):  # FSDP/DDP comm happens inside
                loss.backward()
            with tr.span(Op.OPTIMIZER, step=step):  # ZeRO-1: + untraced broadcasts
                opt.step()
            losses.append(loss.item())
    params = [_local(p) for p in model.parameters()]
    grads = [_local(p.grad) for p in model.parameters() if p.grad is not None]
    inner = opt.optim if stage == 1 else opt
    states = [_local(t) for t in acc.optimizer_tensors(inner)]
    mine = acc.storage_bytes({"params": params, "grads": grads, "optimizer": states})
    row = torch.tensor([mine[k] for k in acc.TERMS], dtype=torch.int64)
    table = torch.empty(n * 3, dtype=torch.int64)
    ctx.comm.all_gather(table, row, name="metrics")
    pred = acc.predicted(num_params, n, stage, "fp32", cfg.optimizer)
    comm = acc.comm_per_step(ctx.events(), n)
    out = RankOutput(losses=losses)
    out.metrics.update({
        "zero_stage": stage, "impl": "torch", "precision": "fp32", "num_params": num_params,
        "per_rank_bytes": [dict(zip(acc.TERMS, r)) for r in table.view(n, 3).tolist()],
        "predicted_bytes": pred["bytes"], "bytes_per_param": pred["bytes_per_param"],
        "theory_precision": "fp32", "comm_bytes_per_step": comm["wire"],
        "comm_payload_bytes_per_step": comm["payload"],
        "predicted_comm_bytes_per_step": pred["comm_wire"],
        "ddp_comm_bytes_per_step": pred["ddp_comm_wire"],
        "comm_ratio_vs_ddp": comm["wire"] / pred["ddp_comm_wire"] if n > 1 else 0.0,
        "untraced_broadcast_payload_bytes": 4 * num_params if stage == 1 else 0,
    })
    state = _full_state(model, stage)
    if ctx.rank == 0:
        out.params_sha256 = params_sha256(state.items())
        if cfg.check_reference:
            out.metrics["max_abs_diff_vs_reference"] = max_abs_diff(state, reference_train(cfg, n))
    return out


def _full_state(model: nn.Module, stage: int) -> dict[str, torch.Tensor]:
    """Full fp32 weights on every rank (FSDP2: DTensor.full_tensor, a collective)."""
    if stage == 1:
        return {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in model.state_dict().items()}
