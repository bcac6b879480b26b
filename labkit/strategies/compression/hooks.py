"""DDP comm hooks whose every byte goes through ``labkit.trace.comm`` (and so onto the timeline).

* ``traced_allreduce_hook`` (from ``labkit.strategies.ddp``): the plain bucket all-reduce
  (average), traced.
* fp16: torch's own ``fp16_compress_wrapper`` around the traced all-reduce: torch casts the
  bucket, we move it, torch casts it back. bf16: DDP refuses torch's ``bf16_compress_wrapper``
  unless it runs on CUDA with NCCL >= 2.10 (it checks the hook's name), so ``cast_wrapper``
  does the same three moves itself; gloo reduces bf16 fine.
* PowerSGD: torch's ``powerSGD_hook`` runs unchanged, but while it runs the ``dist`` name
  inside torch's hook modules points at ``TracedDist``, which sends ``all_reduce`` through
  ``labkit.trace.comm`` (everything else falls through to ``torch.distributed``).
* ``TopKHook``: ours. Each rank adds its residual (error feedback) to the bucket, keeps
  the k largest magnitudes, all-gathers (values, indices) from every rank, scatters their
  sum into a dense tensor and divides by n; what it did not send becomes next step's residual.
* ``RandomKHook``: ours. The same error feedback, but the k positions are drawn from a seed
  every rank shares (step, bucket), so the ranks pick the same positions and one
  all-reduce of the k values suffices: no indices on the wire.
* ``Int8Hook``: ours. A 4-byte all-reduce (max) agrees on one scale per bucket; each rank
  rounds its bucket to int8 levels in [-127 // n, 127 // n] (so the sum of n ranks still
  fits in int8) and the int8 tensor is all-reduced: a quarter of fp32's bytes. The rounding
  error is the residual carried into the next step (error feedback).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from labkit.base.events import Op
from labkit.strategies.ddp.torch_ddp import StepRef, traced_allreduce_hook

__all__ = ["Int8Hook", "RandomKHook", "StepRef", "TopKHook", "TracedDist", "cast_wrapper",
           "traced_allreduce_hook", "traced_torch_hooks"]


def cast_wrapper(hook: Any, dtype: torch.dtype) -> Any:
    """Cast the bucket to ``dtype``, run ``hook`` on it, cast the result back in place."""

    def cast_hook(state, bucket):  # type: ignore[no-untyped-def]
        full = bucket.buffer()
        bucket.set_buffer(full.to(dtype))
        return hook(state, bucket).then(lambda fut: full.copy_(fut.value()))

    return cast_hook


class _Work:
    """What ``dist.all_reduce(..., async_op=True)`` returns, backed by a labkit Handle."""

    def __init__(self, handle: Any):
        self._h = handle

    def get_future(self) -> Any:
        return self._h.future()

    def wait(self) -> bool:
        self._h.wait()
        return True


class TracedDist:
    """Stands in for the ``torch.distributed`` module inside torch's hook modules."""

    def __init__(self, comm: Any, step: StepRef):
        self._comm, self._step = comm, step

    def __getattr__(self, name: str) -> Any:
        return getattr(dist, name)

    def all_reduce(self, tensor: torch.Tensor, op: Any = None, group: Any = None,
                   async_op: bool = False) -> Any:
        h = self._comm.all_reduce(tensor, async_op=True, step=self._step.now, name="powersgd")
        if async_op:
            return _Work(h)
        h.wait()
        return None


class _TorchWithoutCuda:
    """``torch`` as torch's PowerSGD hook sees it on a CPU rank: without CUDA. The hook calls
    ``torch.cuda.synchronize(device)`` whenever CUDA is available, and with a CPU bucket on a
    GPU machine that raises ("Expected a cuda device, but got: cpu": lesson 06's gloo runs on
    the H200, torch 2.11). Everything else is torch's own."""

    class cuda:  # stands in for the torch.cuda module
        @staticmethod
        def is_available() -> bool:
            return False

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


@contextlib.contextmanager
def traced_torch_hooks(comm: Any, step: StepRef, on_cpu: bool = False) -> Iterator[None]:
    """While active, torch's default and PowerSGD hooks all-reduce through ``comm``; with
    ``on_cpu`` (the ranks' buckets live on the CPU) PowerSGD sees no CUDA."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    shim = TracedDist(comm, step)
    saved = (default_hooks.dist, powerSGD_hook.dist, powerSGD_hook.torch)
    default_hooks.dist = powerSGD_hook.dist = shim  # type: ignore[assignment]
    if on_cpu:
        powerSGD_hook.torch = _TorchWithoutCuda()  # type: ignore[assignment]
    try:
        yield
    finally:
        default_hooks.dist, powerSGD_hook.dist, powerSGD_hook.torch = saved  # type: ignore[assignment]


class _FeedbackHook:
    """Error feedback shared by the hooks below: the residual each bucket did not send."""

    def __init__(self, comm: Any, tracer: Any, step: StepRef):
        self.comm, self.tracer, self.step = comm, tracer, step
        self.residual: dict[int, torch.Tensor] = {}
        self.bucket_numel: dict[int, int] = {}

    def _with_residual(self, buf: torch.Tensor, idx: int) -> torch.Tensor:
        err = self.residual.get(idx)
        self.bucket_numel[idx] = buf.numel()
        return buf + err if err is not None and err.numel() == buf.numel() else buf.clone()


class TopKHook(_FeedbackHook):
    """Top-k sparsification with error feedback, one all-gather per bucket."""

    def __init__(self, comm: Any, tracer: Any, step: StepRef, ratio: float):
        super().__init__(comm, tracer, step)
        self.ratio = ratio

    def k_for(self, numel: int) -> int:
        return max(1, int(self.ratio * numel))

    def __call__(self, _state, bucket):  # type: ignore[no-untyped-def]
        buf, idx, n = bucket.buffer(), bucket.index(), self.comm.world_size
        # 1. error feedback: add back what earlier steps did not send
        with self.tracer.span(Op.COMPRESS, step=self.step.now, bucket=idx):
            v = self._with_residual(buf, idx)
            k = self.k_for(v.numel())
            # 2. keep the k largest magnitudes; the rest is the new residual
            top = v.abs().topk(k, sorted=False).indices
            vals = v[top]
            v[top] = 0
            self.residual[idx] = v
            packed = torch.cat([vals, top.to(torch.int32).view(torch.float32)])
        gathered = torch.empty(n * 2 * k, dtype=packed.dtype, device=packed.device)
        # 3. every rank's (values, indices), all-gathered through the traced layer
        h = self.comm.all_gather(gathered, packed, async_op=True, step=self.step.now, bucket=idx)

        def decode(_fut: Any) -> torch.Tensor:
            # 4. scatter-add every rank's values, average over ranks
            parts = gathered.view(n, 2, k)
            where = parts[:, 1, :].contiguous().view(torch.int32).reshape(-1).long()
            dense = torch.zeros_like(buf)
            dense.index_add_(0, where, parts[:, 0, :].reshape(-1))
            return buf.copy_(dense.div_(n))

        return h.future().then(decode)


class RandomKHook(_FeedbackHook):
    """Random-k sparsification with error feedback: shared positions, one all-reduce."""

    def __init__(self, comm: Any, tracer: Any, step: StepRef, ratio: float):
        super().__init__(comm, tracer, step)
        self.ratio = ratio

    def __call__(self, _state, bucket):  # type: ignore[no-untyped-def]
        buf, idx, n = bucket.buffer(), bucket.index(), self.comm.world_size
        with self.tracer.span(Op.COMPRESS, step=self.step.now, bucket=idx):
            # 1. error feedback, 2. the same k positions on every rank (a shared seed)
            v = self._with_residual(buf, idx)
            k = max(1, int(self.ratio * v.numel()))
            g = torch.Generator().manual_seed(int(self.step.now or 0) * 100_003 + idx)
            pick = torch.randperm(v.numel(), generator=g)[:k].to(v.device)
            vals = v[pick].contiguous()
            v[pick] = 0
            self.residual[idx] = v
        # 3. only the values travel: one all-reduce of k floats
        h = self.comm.all_reduce(vals, async_op=True, step=self.step.now, bucket=idx)

        def decode(_fut: Any) -> torch.Tensor:
            dense = torch.zeros_like(buf)
            dense[pick] = vals / n
            return buf.copy_(dense)

        return h.future().then(decode)


class Int8Hook(_FeedbackHook):
    """8-bit quantised all-reduce with a shared per-bucket scale and error feedback."""

    def __call__(self, _state, bucket):  # type: ignore[no-untyped-def]
        buf, idx, n = bucket.buffer(), bucket.index(), self.comm.world_size
        with self.tracer.span(Op.COMPRESS, step=self.step.now, bucket=idx):
            v = self._with_residual(buf, idx)
            amax = v.abs().max().reshape(1).float()
        # 1. one scale for every rank: the largest magnitude anywhere (4 bytes)
        self.comm.all_reduce(amax, op="max", step=self.step.now, bucket=idx, name="int8-scale")
        levels = max(1, 127 // n)  # n ranks' sum must still fit in int8
        scale = float(amax.item()) / levels or 1.0
        with self.tracer.span(Op.COMPRESS, step=self.step.now, bucket=idx):
            # 2. round to int8 levels; what rounding lost is next step's residual
            q = (v / scale).round().clamp(-levels, levels).to(torch.int8)
            self.residual[idx] = v - q.to(v.dtype) * scale
        h = self.comm.all_reduce(q, async_op=True, step=self.step.now, bucket=idx)

        def decode(_fut: Any) -> torch.Tensor:
            return buf.copy_(q.to(buf.dtype) * (scale / n))

        return h.future().then(decode)
