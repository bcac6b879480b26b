"""DDP comm hooks whose every byte goes through ``labkit.comm`` (and so onto the timeline).

* ``traced_allreduce_hook`` (from ``labkit.strategies.ddp``): the plain bucket all-reduce
  (average), traced.
* fp16: torch's own ``fp16_compress_wrapper`` around the traced all-reduce: torch casts the
  bucket, we move it, torch casts it back. bf16: DDP refuses torch's ``bf16_compress_wrapper``
  unless it runs on CUDA with NCCL >= 2.10 (it checks the hook's name), so ``cast_wrapper``
  does the same three moves itself; gloo reduces bf16 fine.
* PowerSGD: torch's ``powerSGD_hook`` runs unchanged, but while it runs the ``dist`` name
  inside torch's hook modules points at ``TracedDist``, which sends ``all_reduce`` through
  ``labkit.comm`` (everything else falls through to ``torch.distributed``).
* ``TopKHook``: ours. Each rank adds its residual (error feedback) to the bucket, keeps
  the k largest magnitudes, all-gathers (values, indices) from every rank, scatters their
  sum into a dense tensor and divides by n; what it did not send becomes next step's residual.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from labkit.events import Op
from labkit.strategies.ddp.torch_ddp import StepRef, traced_allreduce_hook

__all__ = ["StepRef", "TopKHook", "TracedDist", "cast_wrapper", "traced_allreduce_hook",
           "traced_torch_hooks"]


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


@contextlib.contextmanager
def traced_torch_hooks(comm: Any, step: StepRef) -> Iterator[None]:
    """While active, torch's default and PowerSGD hooks all-reduce through ``comm``."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    shim = TracedDist(comm, step)
    saved = (default_hooks.dist, powerSGD_hook.dist)
    default_hooks.dist = powerSGD_hook.dist = shim  # type: ignore[assignment]
    try:
        yield
    finally:
        default_hooks.dist, powerSGD_hook.dist = saved  # type: ignore[assignment]


class TopKHook:
    """Top-k sparsification with error feedback, one all-gather per bucket."""

    def __init__(self, comm: Any, tracer: Any, step: StepRef, ratio: float):
        self.comm, self.tracer, self.step, self.ratio = comm, tracer, step, ratio
        self.residual: dict[int, torch.Tensor] = {}
        self.bucket_numel: dict[int, int] = {}

    def k_for(self, numel: int) -> int:
        return max(1, int(self.ratio * numel))

    def __call__(self, _state, bucket):  # type: ignore[no-untyped-def]
        buf, idx, n = bucket.buffer(), bucket.index(), self.comm.world_size
        # 1. error feedback: add back what earlier steps did not send
        with self.tracer.span(Op.COMPRESS, step=self.step.now, bucket=idx):
            err = self.residual.get(idx)
            v = buf + err if err is not None and err.numel() == buf.numel() else buf.clone()
            k = self.k_for(v.numel())
            # 2. keep the k largest magnitudes; the rest is the new residual
            top = v.abs().topk(k, sorted=False).indices
            vals = v[top]
            v[top] = 0
            self.residual[idx] = v
            packed = torch.cat([vals, top.to(torch.int32).view(torch.float32)])
        self.bucket_numel[idx] = v.numel()
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
