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
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn

from labkit.base.events import Op
from labkit.rank.context import RunContext
from labkit.strategies.zero import ZeroMetrics
from labkit.strategies.zero import accounting as acc
from labkit.train.loop import TrainLoop
from labkit.train.models import build_model
from labkit.train.optim import make_optimizer


class _TracedAllGather:
    """FSDP2's all-gather, sent through ``ctx.comm`` (duck-types FSDP2's AllGather)."""

    def __init__(self, ctx: RunContext, clock: Any):
        self.ctx, self.clock = ctx, clock

    def allocate(self, size: Sequence[Any], *, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any,
                 async_op: bool = False) -> Any:
        return self.ctx.comm.all_gather(output_tensor, input_tensor, async_op=async_op,
                                        step=self.clock.now, name="fsdp AG")


class _TracedReduceScatter(_TracedAllGather):
    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,  # type: ignore[override]
                 group: Any, op: Any, async_op: bool = False) -> Any:
        name = "sum" if op == dist.ReduceOp.SUM else "avg"
        return self.ctx.comm.reduce_scatter(output_tensor, input_tensor, op=name,
                                            async_op=async_op, step=self.clock.now,
                                            name="fsdp RS")


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # DTensor -> this rank's shard


def _wrap(ctx: RunContext, model: nn.Sequential, stage: int) -> tuple[nn.Module, Any, Any]:
    """(the module forward calls, the optimizer, the object whose ``now`` tags spans)."""
    cfg = ctx.config
    if stage == 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel

        from labkit.strategies.ddp.torch_ddp import StepRef, traced_allreduce_hook

        ddp = DistributedDataParallel(model, gradient_as_bucket_view=True)
        ref = StepRef()
        ddp.register_comm_hook(None, traced_allreduce_hook(ctx.dp_comm, ref))
        optim_cls = type(make_optimizer(cfg.optimizer, [torch.zeros(1)], cfg.lr))
        kwargs = {"momentum": 0.9} if cfg.optimizer == "momentum" else {}
        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=optim_cls, lr=cfg.lr,
                                      **kwargs)  # type: ignore[arg-type]
        return ddp, opt, ref
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    clock = _Clock()
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    units = [fully_shard(m, mesh=mesh) for m in model if isinstance(m, nn.Linear)]
    root = fully_shard(model, mesh=mesh)
    for unit in units + [root]:
        # duck-typed to torch's AllGather / ReduceScatter protocols
        unit.set_custom_all_gather(_TracedAllGather(ctx, clock))  # type: ignore[arg-type]
        unit.set_custom_reduce_scatter(_TracedReduceScatter(ctx, clock))  # type: ignore[arg-type]
    return model, make_optimizer(cfg.optimizer, model.parameters(), cfg.lr), clock


class _Clock:
    now = 0


class TorchZeroLoop(TrainLoop[ZeroMetrics]):
    """``TrainLoop`` around torch's ZeroRedundancyOptimizer (stage 1) or FSDP2 (stage 3)."""

    Record = ZeroMetrics

    def __init__(self, ctx: RunContext):
        self.stage = ctx.config.options.stage
        model = cast(nn.Sequential, build_model(ctx.config))
        wrapped, opt, self.clock_ref = _wrap(ctx, model, self.stage)
        super().__init__(ctx, wrapped, full_model=model, optimizer=opt, clock=False)

    def begin_step(self, step: int) -> None:
        self.clock_ref.now = step

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=False)  # DDP's bucket views and FSDP keep theirs

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, step: int) -> torch.Tensor:
        with self.ctx.tracer.span(Op.FORWARD, step=step):
            loss = nn.functional.cross_entropy(self.model(x), y)
        with self.ctx.tracer.span(Op.BACKWARD, step=step):  # FSDP/DDP comm happens inside
            loss.backward()
        return loss

    def fill_record(self) -> None:
        model, n, stage = self.full_model, self.ctx.world_size, self.stage
        params = [_local(p) for p in model.parameters()]
        grads = [_local(p.grad) for p in model.parameters() if p.grad is not None]
        inner: Any = self.optimizer.optim if stage == 1 else self.optimizer  # type: ignore[union-attr]
        states = [_local(t) for t in acc.optimizer_tensors(inner)]
        rec = self.record
        rec.zero_stage, rec.impl, rec.precision = stage, "torch", "fp32"
        rec.model_state_bytes = acc.storage_bytes(
            {"params": params, "grads": grads, "optimizer": states})
        pred = acc.predicted(self.stats[0], n, stage, "fp32", self.cfg.optimizer)
        acc.fill_prediction(rec, pred, acc.comm_per_step(self.ctx.events(), n), n)
        rec.untraced_broadcast_payload_bytes = 4 * self.stats[0] if stage == 1 else 0

    def final_state(self) -> dict[str, torch.Tensor]:
        """Full fp32 weights on every rank (FSDP2: DTensor.full_tensor, a collective)."""
        sd = self.full_model.state_dict()
        return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu().clone()
                for k, v in sd.items()}
