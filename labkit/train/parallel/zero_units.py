"""ZeRO's unit: one module's parameters as one flat buffer, sharded over the data ranks.

Every parameter-owning module becomes a ``FlatUnit`` (a Linear layer a ``FlatLayer``): its
tensors flattened into one 1-D buffer, padded with zeros to a multiple of ``world_size``
so every rank owns an equal shard (``shard = padded / world_size`` elements; rank r owns
``[r*shard, (r+1)*shard)``).
What each stage keeps between steps (Rajbhandari et al. 2020, section 5):

==========  ====================  =====================  ==============================
stage       parameters            gradients              optimizer state (+ fp32 master)
==========  ====================  =====================  ==============================
0           full buffer           full buffer            full
1           full buffer           full buffer            own shard
2           full buffer           own shard              own shard
3           own shard             own shard              own shard
==========  ====================  =====================  ==============================

``ShardedLinear`` is an autograd function, so the mechanism is written out: in stage 3
forward it (1) all-gathers the layer's parameters, (2) computes, (3) frees them
(``FlatUnit.gathered``); backward (1) all-gathers them again, (2) computes both gradients,
(3) frees the parameters and (4) reduce-scatters the flat gradient straight into this
rank's gradient shard (stage 2 does the same reduce-scatter; stage 0 all-reduces; stage 1
waits for the step's end).
Transient buffers are reported to a ``Meter`` so the lesson can show the peak inside a step.

A unit used more than once in a step (a module called twice, a weight tied to another
layer's) gets one backward per use: it adds their gradients up and reduces once, after the
last (``pending`` counts the uses whose backward is still to come). A *frozen* unit
(``trainable=False``: parameters with ``requires_grad=False``) is sharded and gathered like
any other but has no gradient buffer and no optimizer state, and is never updated.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn import functional as F

from labkit.base.events import Op
from labkit.trace.comm import Comm


class Meter:
    """Adds up the transient model-state buffers alive inside a step; keeps the maximum."""

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0

    def alloc(self, *tensors: torch.Tensor) -> None:
        self.live += sum(t.numel() * t.element_size() for t in tensors)
        self.peak = max(self.peak, self.live)

    def free(self, *tensors: torch.Tensor) -> None:
        self.live -= sum(t.numel() * t.element_size() for t in tensors)

    def reset(self) -> None:
        self.live = self.peak = 0


class FlatUnit:
    """The parameters of one module (any shapes) as a flat, padded, shardable buffer."""

    def __init__(self, index: int, tensors: list[torch.Tensor], *, stage: int,
                 dtype: torch.dtype, pad: bool, comm: Comm, meter: Meter, defer: bool = False,
                 trainable: bool = True, device: torch.device | str | None = None):
        self.index, self.stage, self.dtype, self.comm, self.meter = index, stage, dtype, comm, meter
        self.trainable = trainable
        self.pending = 0
        """Uses in this step whose backward has not run yet (counted as they start)."""
        self.partial: torch.Tensor | None = None
        """The summed gradients of the uses whose backward ran, until the last one does."""
        self.shapes = [t.shape for t in tensors]
        self.numel = sum(t.numel() for t in tensors)
        self.defer = defer
        """Accumulate gradients over microbatches and reduce once per step (``flush``)."""
        self.acc: torch.Tensor | None = None
        n, rank = comm.world_size, comm.rank
        # 1. pad so every rank's shard is the same size (stage 0 never shards: no padding)
        self.padded = self.numel if stage == 0 or not pad else math.ceil(self.numel / n) * n
        self.shard = self.padded // n
        self.lo, self.hi = rank * self.shard, (rank + 1) * self.shard
        # every buffer on the rank's device (``device``; else the default device while the
        # unit is built: the model itself may have been initialised on the CPU), named
        # explicitly from then on: ``torch.set_default_device`` is thread-local, and on a GPU
        # backward hooks run on autograd's device thread, where a bare torch.zeros lands on
        # the CPU (NCCL refuses it)
        self.device = torch.device(device) if device is not None else torch.get_default_device()
        full32 = torch.zeros(self.padded, device=self.device)
        if tensors:
            full32[:self.numel] = torch.cat([t.detach().reshape(-1).float() for t in tensors])
        # 2. parameters: the whole buffer (stages 0-2) or only this rank's shard (stage 3)
        self.full: torch.Tensor | None = None
        self.param_shard: torch.Tensor | None = None
        if stage == 3:
            self.param_shard = full32[self.lo:self.hi].to(dtype).clone()
        else:
            self.full = full32.to(dtype).clone()
        # 3. gradients: the whole buffer (stages 0-1) or only this rank's shard (stages 2-3)
        self.grad = torch.zeros((self.padded if stage <= 1 else self.shard) if trainable else 0,
                                dtype=dtype, device=self.device)
        # 4. the tensor the optimizer updates: fp32 master copy under bf16, else the params
        #    (a frozen unit's "master" is its own parameters: only read, for the final state)
        owned = full32 if stage == 0 else full32[self.lo:self.hi]
        if dtype != torch.float32 and trainable:
            self.master: torch.Tensor = owned.clone()
        elif stage == 0:
            self.master = self.full  # type: ignore[assignment]
        elif stage in (1, 2):
            self.master = self.full[self.lo:self.hi]  # type: ignore[index]
        else:
            self.master = self.param_shard  # type: ignore[assignment]
        # autograd calls the unit's backward only if some input requires grad
        self.anchor = torch.empty(0, requires_grad=True, device=self.device)

    # ---- parameters ------------------------------------------------------------------
    def views(self, full: torch.Tensor) -> list[torch.Tensor]:
        """The parameters as views of the flat buffer, in their original shapes."""
        out, offset = [], 0
        for shape in self.shapes:
            size = math.prod(shape)
            out.append(full[offset:offset + size].view(shape))
            offset += size
        return out

    def acquire(self, step: int, phase: str) -> torch.Tensor:
        """The full flat parameters; in stage 3 all-gathered now (free with ``release``)."""
        if self.full is not None:
            return self.full
        gathered = torch.empty(self.padded, dtype=self.dtype, device=self.device)
        self.meter.alloc(gathered)
        assert self.param_shard is not None  # stage 3 keeps only its shard between uses
        self.comm.all_gather(gathered, self.param_shard, step=step, bucket=self.index,
                             name=f"AG{self.index}{phase[0]}")
        return gathered

    def release(self, gathered: torch.Tensor) -> None:
        if gathered is not self.full:
            self.meter.free(gathered)  # the last reference goes when the caller returns

    @contextlib.contextmanager
    def gathered(self, step: int, phase: str) -> Iterator[torch.Tensor]:
        """ZeRO-3's rhythm around every use of the parameters: (1) all-gather them (stages
        0-2 hold them whole already), (2) compute inside the block, (3) free them."""
        full = self.acquire(step, phase)
        try:
            yield full
        finally:
            self.release(full)

    # ---- gradients -------------------------------------------------------------------
    def reduce_grads(self, grads: list[torch.Tensor | None], step: int) -> None:
        """Average this unit's fresh gradients over ranks, keeping what the stage keeps
        (deferred units only add them up; ``flush`` reduces once per step). A unit used
        several times in the step adds each use's gradients up and reduces after the last."""
        flat = torch.zeros(self.padded, dtype=self.dtype, device=self.device)
        offset = 0
        for g, shape in zip(grads, self.shapes):
            size = math.prod(shape)
            if g is not None:
                flat[offset:offset + size] = g.reshape(-1)
            offset += size
        if self.defer:
            if self.acc is None:
                self.acc = flat
                self.meter.alloc(flat)
            else:
                self.acc.add_(flat)
            return
        if self.partial is not None:  # an earlier use's gradients of this step
            self.partial.add_(flat)
            flat = self.partial
        else:
            self.meter.alloc(flat)
        self.pending = max(0, self.pending - 1)
        if self.pending > 0:
            self.partial = flat  # more uses' backwards to come: reduce after the last
            return
        self.partial = None
        self._reduce(flat, step)
        self.meter.free(flat)

    def new_step(self) -> None:
        """Forget uses whose backward never ran (a forward without backward)."""
        if self.partial is not None:
            self.meter.free(self.partial)
        self.pending, self.partial = 0, None

    def flush(self, step: int) -> None:
        """A deferred unit's one reduction per step, of the gradients summed over microbatches."""
        if self.acc is None:
            raise RuntimeError(f"unit {self.index} got no gradient this step")
        self._reduce(self.acc, step)
        self.meter.free(self.acc)
        self.acc = None

    def _reduce(self, flat: torch.Tensor, step: int) -> None:
        if self.stage == 0:  # DDP: every rank gets the whole averaged gradient
            self.grad.copy_(flat)
            self.comm.all_reduce(self.grad, op="avg", step=step, bucket=self.index,
                                 name=f"AR{self.index}")
        elif self.stage == 1:  # kept whole; reduce-scattered once backward is over
            self.grad.copy_(flat)
        else:  # stages 2-3: reduce-scatter now; only this rank's shard survives
            self.comm.reduce_scatter(self.grad, flat, op="avg", step=step, bucket=self.index,
                                     name=f"RS{self.index}")

    def grad_for_optimizer(self, step: int) -> torch.Tensor:
        """The averaged gradient of the slice the optimizer owns (fp32)."""
        if self.stage == 0:
            return self.grad.float() if self.dtype != torch.float32 else self.grad
        if self.stage == 1:
            shard = torch.empty(self.shard, dtype=self.dtype, device=self.device)
            self.meter.alloc(shard)
            self.comm.reduce_scatter(shard, self.grad, op="avg", step=step, bucket=self.index,
                                     name=f"RS{self.index}")
            return shard.float() if self.dtype != torch.float32 else shard
        return self.grad.float() if self.dtype != torch.float32 else self.grad

    def publish(self, step: int) -> None:
        """After the update: copy master into the working weights; stages 1-2 all-gather."""
        if self.stage == 3:
            if self.master is not self.param_shard:
                self.param_shard.copy_(self.master)  # type: ignore[union-attr]
            return
        assert self.full is not None
        if self.stage == 0:
            if self.master is not self.full:
                self.full.copy_(self.master)
            return
        mine = self.master.to(self.dtype).clone()  # all_gather must not read its own output
        self.meter.alloc(mine)
        self.comm.all_gather(self.full, mine, step=step, bucket=self.index,
                             name=f"AG{self.index}")
        self.meter.free(mine)

    def kept(self) -> dict[str, list[torch.Tensor]]:
        """The tensors this unit keeps between steps, by model-state term."""
        params = [t for t in (self.full, self.param_shard, self.anchor) if t is not None]
        if not self.trainable:
            return {"params": params, "grads": [], "optimizer": []}
        return {"params": params, "grads": [self.grad], "optimizer": [self.master]}

    def padding(self) -> int:
        """Padding elements inside this rank's shard (the last ranks hold the zeros)."""
        return max(0, self.hi - max(self.lo, self.numel))

    def gather_full(self, name: str = "final") -> torch.Tensor:
        """The whole fp32 flat parameters (a collective over the unit's ranks in stages 1-3)."""
        if self.stage == 0:
            return self.master.float()
        full = torch.empty(self.padded, device=self.device)
        self.comm.all_gather(full, self.master.float().clone(), name=name)
        return full


class FlatLayer(FlatUnit):
    """One Linear layer (out x in weight, optional out bias) as a ``FlatUnit``."""

    def __init__(self, index: int, weight: torch.Tensor, bias: torch.Tensor | None, **kw: Any):
        super().__init__(index, [weight] if bias is None else [weight, bias], **kw)
        self.out_dim, self.in_dim = weight.shape
        self.has_bias = bias is not None

    def weights(self, full: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        views = self.views(full)
        return views[0], views[1] if self.has_bias else None


class ShardedLinear(torch.autograd.Function):
    """``y = x W^T + b`` whose parameters live in a ``FlatLayer`` (see module docstring)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, _anchor: torch.Tensor, layer: FlatLayer,
                step: int) -> torch.Tensor:
        xc = x.to(layer.dtype)
        with layer.gathered(step, "forward") as full, \
                layer.comm.tracer.detail(Op.FORWARD, step=step, name=f"F{layer.index}"):
            w, b = layer.weights(full)
            y = F.linear(xc, w, b)
        ctx.layer, ctx.step, ctx.in_dtype = layer, step, x.dtype
        ctx.save_for_backward(xc)
        return y

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple[Any, ...]:
        (x,) = ctx.saved_tensors
        layer: FlatLayer = ctx.layer
        gy = gy.to(layer.dtype)
        with layer.gathered(ctx.step, "backward") as full, \
                layer.comm.tracer.detail(Op.BACKWARD, step=ctx.step, name=f"B{layer.index}"):
            w, _ = layer.weights(full)
            gx = gy @ w                                # input and weight gradients
            g2, x2 = gy.reshape(-1, gy.shape[-1]), x.reshape(-1, x.shape[-1])
            gw, gb = g2.t() @ x2, g2.sum(0) if layer.has_bias else None
        layer.reduce_grads([gw, gb], ctx.step)         # 4. all-reduce / keep / reduce-scatter
        return gx.to(ctx.in_dtype), None, None, None
