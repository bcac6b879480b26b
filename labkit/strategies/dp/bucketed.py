"""``ddp-bucketed``: our own bucketed DDP, all-reduces overlapped with backward.

See ``buckets.py`` for the mechanism. The timeline shows comm spans starting inside the
backward span (hidden communication) and a short wait at the end (exposed communication).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from labkit.rank.context import RankOutput, RunContext
from labkit.strategies.dp.buckets import BucketManager
from labkit.strategies.dp.loop import grad_bytes, train_data_parallel


class BucketedSync:
    """Buckets filled by hooks during backward; ``finish`` waits for the last ones."""

    def __init__(self, cap_mb: float):
        self.cap_bytes = cap_mb * 1e6
        self.manager: BucketManager | None = None
        self._params: list[tuple[str, nn.Parameter]] = []

    def attach(self, ctx: RunContext, params: list[tuple[str, nn.Parameter]]) -> None:
        self._params = params
        self.manager = BucketManager(params, ctx.comm, self.cap_bytes)

    def begin_step(self, step: int) -> None:
        assert self.manager is not None
        self.manager.reset()
        self.manager.step = step

    def finish(self, step: int) -> None:
        assert self.manager is not None
        self.manager.wait_all()

    def describe(self) -> dict[str, Any]:
        assert self.manager is not None
        sizes = [b.nbytes for b in self.manager.buckets]
        return {"bytes_per_step": grad_bytes(self._params), "buckets": len(sizes),
                "bucket_bytes": sizes, "allreduce_calls_per_step": len(sizes),
                "bucket_params": [[n for n, _ in b.params] for b in self.manager.buckets]}


def train(ctx: RunContext) -> RankOutput:
    cfg = ctx.config
    return train_data_parallel(ctx, BucketedSync(cfg.options.bucket_cap_mb))
