"""Torch's DistributedDataParallel, with every bucket all-reduce on the timeline.

DDP groups gradients into buckets (in reverse order of the parameters, which is roughly
the order backward produces them) and all-reduces a bucket as soon as it is full, while
backward keeps computing earlier layers. A comm hook (``register_comm_hook``) routes each
bucket's all-reduce through labkit's traced comm layer, so the overlap shows up as comm
spans that sit under the backward compute span. The training loop is ``TrainLoop``'s:
DDP averages inside backward, so there is no ``sync`` step of our own.

A run on one rank has nothing to average: torch's DDP would still copy every gradient into
its buckets and all-reduce them over a group of one (about 10 % of a small GPT's step,
``bench/bench_step.py``), so ``ddp`` trains the bare model there, as a student's loop would,
and times its backward as one span (no per-parameter hook: nothing can wait inside it).
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from labkit.rank.context import RankOutput, RunContext
from labkit.strategies.dp import DPMetrics
from labkit.train.loop import TrainLoop
from labkit.train.models import build_model


def traced_allreduce_hook(comm: Any, step: Any) -> Any:
    """A DDP comm hook that averages each bucket with one traced async all-reduce.

    ``step.now`` tags the spans with the current step (DDP calls hooks without it).
    """
    # no annotations: DDP rejects a hook whose ``bucket`` annotation is not dist.GradBucket,
    # and this module's annotations are strings (``from __future__ import annotations``)
    def hook(_state, bucket):  # type: ignore[no-untyped-def]
        step.buckets.add(bucket.index())
        h = comm.all_reduce(bucket.buffer(), async_op=True, step=step.now, bucket=bucket.index())
        world = comm.world_size
        return h.future().then(lambda fut: fut.value()[0].div_(world))

    return hook


class StepRef:
    """The step the hooks tag their spans with, and the buckets they have seen."""

    def __init__(self) -> None:
        self.now = 0
        self.buckets: set[int] = set()


D = TypeVar("D", bound=DPMetrics)


class TorchDDPLoop(TrainLoop[D]):
    """``TrainLoop`` around ``DistributedDataParallel``; subclasses swap the comm hook."""

    Record = DPMetrics
    wraps_one_replica: ClassVar[bool] = False
    """Wrap the model in DDP even when the run has one data-parallel rank (a subclass whose
    hook changes the gradients, e.g. compression, must; plain averaging has nothing to do)."""

    def __init__(self, ctx: RunContext, bucket_cap_mb: float):
        model = build_model(ctx.config).to(ctx.device)
        self.step_ref = StepRef()
        if ctx.dp_comm.world_size == 1 and not self.wraps_one_replica:
            # nothing waits inside a bare model's backward: its return is its last gradient,
            # so no per-parameter hook has to note when that came (``BackwardClock``)
            super().__init__(ctx, model, clock=False)
            return
        ids = [ctx.local_rank] if ctx.device.type == "cuda" else None
        ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb, device_ids=ids)
        super().__init__(ctx, ddp, full_model=model, params=list(ddp.parameters()))
        self.register_hook(ddp)

    @property
    def hook_comm(self) -> Any:
        """The group the comm hook reduces over: the data-parallel one; in a world of one
        rank wrapped anyway (``wraps_one_replica``), the world's own group of one, since a
        grid axis of one rank records nothing (``labkit.rank.subgroups``) and the hook's
        traffic is why the replica is wrapped."""
        return self.ctx.comm if self.ctx.world_size == 1 else self.ctx.dp_comm

    def register_hook(self, ddp: DistributedDataParallel) -> None:
        ddp.register_comm_hook(None, traced_allreduce_hook(self.hook_comm, self.step_ref))

    def begin_step(self, step: int) -> None:
        self.step_ref.now = step

    def fill_record(self) -> None:
        model: nn.Module = self.full_model
        self.record.bytes_per_step = sum(p.numel() * p.element_size() for p in model.parameters())
        self.record.buckets = len(self.step_ref.buckets)


def train(ctx: RunContext) -> RankOutput:
    return TorchDDPLoop[DPMetrics](ctx, ctx.config.options.bucket_cap_mb).run()
