"""SyncBatchNorm built on the traced comm layer: BatchNorm statistics of the global batch.

BatchNorm (Ioffe and Szegedy 2015) normalises with the mean and variance of the batch it
sees. Under data parallelism each rank sees only its shard, so N ranks with batch b do
not train the model one process trains on N x b (seed 000's common mistake, "synchronized
BatchNorm (or GN)"). SyncBatchNorm (PyTorch's ``nn.SyncBatchNorm``, which follows the same
algebra) all-reduces the statistics instead:

1. forward: all-reduce each channel's sum and sum of squares (and the sample count), so
   every rank normalises with the global batch's mean and variance;
2. backward: all-reduce each channel's sum of ``dy`` and of ``dy * x_hat``, the two global
   means the input gradient needs: ``dx = w / sigma * (dy - mean(dy) - x_hat mean(dy x_hat))``.

Every all-reduce goes through ``ctx.comm`` (name ``"syncbn"``), so its bytes are on the
timeline: ``2C + 1`` values forward and ``2C`` backward per layer and step, for C channels.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class _SyncBNFunction(torch.autograd.Function):
    """Normalise with global statistics; the backward all-reduces its two sums."""

    @staticmethod
    def forward(fctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                comm: Any, step: int | None, eps: float) -> torch.Tensor:
        # 1. global sum, sum of squares and count, in one traced all-reduce
        stats = torch.cat([x.sum(0), (x * x).sum(0), x.new_tensor([x.shape[0]])])
        comm.all_reduce(stats, step=step, name="syncbn")
        c = x.shape[1]
        count = stats[-1]
        mean = stats[:c] / count
        var = stats[c:2 * c] / count - mean * mean
        invstd = torch.rsqrt(var + eps)
        x_hat = (x - mean) * invstd
        fctx.save_for_backward(x_hat, weight, invstd)
        fctx.comm, fctx.step, fctx.count = comm, step, count
        fctx.stats = (mean.detach(), var.detach() * count / (count - 1))  # for running stats
        return x_hat * weight + bias

    @staticmethod
    def backward(fctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        x_hat, weight, invstd = fctx.saved_tensors
        # 2. the global means of dy and dy * x_hat, in one traced all-reduce
        sums = torch.cat([dy.sum(0), (dy * x_hat).sum(0)])
        fctx.comm.all_reduce(sums, step=fctx.step, name="syncbn")
        c = dy.shape[1]
        mean_dy, mean_dy_xhat = sums[:c] / fctx.count, sums[c:] / fctx.count
        dx = (dy - mean_dy - x_hat * mean_dy_xhat) * invstd * weight
        return dx, (dy * x_hat).sum(0), dy.sum(0), None, None, None


class SyncBatchNorm1d(nn.BatchNorm1d):
    """``nn.BatchNorm1d`` whose training statistics span all ranks of ``comm``."""

    def __init__(self, num_features: int, comm: Any, **kwargs: Any):
        super().__init__(num_features, **kwargs)
        self.comm = comm
        self.step: int | None = None  # set by the training loop: labels the timeline spans

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        fn = _SyncBNFunction.apply
        y = fn(x, self.weight, self.bias, self.comm, self.step, self.eps)
        mean, var = _last_stats(y)
        with torch.no_grad():  # running averages of the GLOBAL statistics, as nn.BatchNorm does
            m = self.momentum if self.momentum is not None else 0.1
            assert self.running_mean is not None and self.running_var is not None
            self.running_mean.mul_(1 - m).add_(mean, alpha=m)
            self.running_var.mul_(1 - m).add_(var, alpha=m)
        return y


def _last_stats(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The statistics the forward just used (kept on the autograd node)."""
    node = y.grad_fn
    assert node is not None
    return node.stats  # type: ignore[attr-defined, no-any-return]
