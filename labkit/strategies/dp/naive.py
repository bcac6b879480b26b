"""``ddp-naive``: average gradients with one blocking all-reduce per parameter, after backward.

The simplest correct data parallelism (the manual gradient sync of seed 002): wait for the
whole backward pass, then all-reduce every gradient, one message each, nothing overlapped.
Its timeline shows compute, then a wall of small all-reduces, then the optimizer.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from labkit.rank.context import RankContext, RankOutput, RunContext
from labkit.strategies.dp.loop import grad_bytes, train_data_parallel


class PerParameterSync:
    """After backward: ``all_reduce(p.grad, avg)`` for every parameter, last layer first."""

    def __init__(self) -> None:
        self._ctx: RankContext | None = None
        self._params: list[tuple[str, nn.Parameter]] = []

    def attach(self, ctx: RankContext, params: list[tuple[str, nn.Parameter]]) -> None:
        self._ctx, self._params = ctx, params

    def begin_step(self, step: int) -> None:
        return None

    def finish(self, step: int) -> None:
        assert self._ctx is not None
        for i, (name, p) in enumerate(reversed(self._params)):
            assert p.grad is not None, f"parameter {name} got no gradient in backward"
            self._ctx.comm.all_reduce(p.grad, op="avg", step=step, bucket=i, name=name)

    def describe(self) -> dict[str, Any]:
        return {"bytes_per_step": grad_bytes(self._params), "buckets": len(self._params),
                "allreduce_calls_per_step": len(self._params)}


def train(ctx: RunContext) -> RankOutput:
    return train_data_parallel(ctx, PerParameterSync())
