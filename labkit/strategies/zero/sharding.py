"""Our ZeRO: each Linear layer as one flat buffer, sharded over the data-parallel ranks.

Every Linear layer of the MLP becomes a ``FlatLayer``: weight and bias flattened into one
1-D buffer, padded with zeros to a multiple of ``world_size`` so every rank owns an equal
shard (``shard = padded / world_size`` elements; rank r owns ``[r*shard, (r+1)*shard)``).
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
forward it (1) all-gathers the layer's parameters, (2) computes, (3) frees them; backward
(1) all-gathers them again, (2) computes both gradients, (3) frees the parameters and
(4) reduce-scatters the flat gradient straight into this rank's gradient shard (stage 2
does the same reduce-scatter; stage 0 all-reduces; stage 1 waits for the step's end).
Transient buffers are reported to a ``Meter`` so the lesson can show the peak inside a step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional as F

from labkit.comm import Comm
from labkit.events import Op


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


class FlatLayer:
    """One Linear layer (out x in weight, out bias) as a flat, padded, shardable buffer."""

    def __init__(self, index: int, weight: torch.Tensor, bias: torch.Tensor, *, stage: int,
                 dtype: torch.dtype, pad: bool, comm: Comm, meter: Meter):
        self.index, self.stage, self.dtype, self.comm, self.meter = index, stage, dtype, comm, meter
        self.out_dim, self.in_dim = weight.shape
        self.numel = weight.numel() + bias.numel()
        n, rank = comm.world_size, comm.rank
        # 1. pad so every rank's shard is the same size (stage 0 never shards: no padding)
        self.padded = self.numel if stage == 0 or not pad else math.ceil(self.numel / n) * n
        self.shard = self.padded // n
        self.lo, self.hi = rank * self.shard, (rank + 1) * self.shard
        full32 = torch.zeros(self.padded)
        full32[:weight.numel()] = weight.detach().flatten()
        full32[weight.numel():self.numel] = bias.detach()
        # 2. parameters: the whole buffer (stages 0-2) or only this rank's shard (stage 3)
        self.full: torch.Tensor | None = None
        self.param_shard: torch.Tensor | None = None
        if stage == 3:
            self.param_shard = full32[self.lo:self.hi].to(dtype).clone()
        else:
            self.full = full32.to(dtype).clone()
        # 3. gradients: the whole buffer (stages 0-1) or only this rank's shard (stages 2-3)
        self.grad = torch.zeros(self.padded if stage <= 1 else self.shard, dtype=dtype)
        # 4. the tensor the optimizer updates: fp32 master copy under bf16, else the params
        owned = full32 if stage == 0 else full32[self.lo:self.hi]
        if dtype != torch.float32:
            self.master: torch.Tensor = owned.clone()
        elif stage == 0:
            self.master = self.full  # type: ignore[assignment]
        elif stage in (1, 2):
            self.master = self.full[self.lo:self.hi]  # type: ignore[index]
        else:
            self.master = self.param_shard  # type: ignore[assignment]
        # autograd calls ShardedLinear.backward only if some input requires grad
        self.anchor = torch.empty(0, requires_grad=True)

    # ---- parameters ------------------------------------------------------------------
    def weights(self, full: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = full[:self.out_dim * self.in_dim].view(self.out_dim, self.in_dim)
        return w, full[self.out_dim * self.in_dim:self.numel]

    def acquire(self, step: int, phase: str) -> torch.Tensor:
        """The full flat parameters; in stage 3 all-gathered now (free with ``release``)."""
        if self.full is not None:
            return self.full
        gathered = torch.empty(self.padded, dtype=self.dtype)
        self.meter.alloc(gathered)
        assert self.param_shard is not None  # stage 3 keeps only its shard between uses
        self.comm.all_gather(gathered, self.param_shard, step=step, bucket=self.index,
                             name=f"AG{self.index}{phase[0]}")
        return gathered

    def release(self, gathered: torch.Tensor) -> None:
        if gathered is not self.full:
            self.meter.free(gathered)  # the last reference goes when the caller returns

    # ---- gradients -------------------------------------------------------------------
    def reduce_grads(self, gw: torch.Tensor, gb: torch.Tensor, step: int) -> None:
        """Average this layer's fresh gradient over ranks, keeping what the stage keeps."""
        flat = torch.zeros(self.padded, dtype=self.dtype)
        flat[:gw.numel()] = gw.flatten()
        flat[gw.numel():self.numel] = gb
        self.meter.alloc(flat)
        if self.stage == 0:  # DDP: every rank gets the whole averaged gradient
            self.grad.copy_(flat)
            self.comm.all_reduce(self.grad, op="avg", step=step, bucket=self.index,
                                 name=f"AR{self.index}")
        elif self.stage == 1:  # kept whole; reduce-scattered once backward is over
            self.grad.copy_(flat)
        else:  # stages 2-3: reduce-scatter now; only this rank's shard survives
            self.comm.reduce_scatter(self.grad, flat, op="avg", step=step, bucket=self.index,
                                     name=f"RS{self.index}")
        self.meter.free(flat)

    def grad_for_optimizer(self, step: int) -> torch.Tensor:
        """The averaged gradient of the slice the optimizer owns (fp32)."""
        if self.stage == 0:
            return self.grad.float() if self.dtype != torch.float32 else self.grad
        if self.stage == 1:
            shard = torch.empty(self.shard, dtype=self.dtype)
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
        """The tensors this layer keeps between steps, by model-state term."""
        params = [t for t in (self.full, self.param_shard, self.anchor) if t is not None]
        return {"params": params, "grads": [self.grad], "optimizer": [self.master]}

    def padding(self) -> int:
        """Padding elements inside this rank's shard (the last ranks hold the zeros)."""
        return max(0, self.hi - max(self.lo, self.numel))


class ShardedLinear(torch.autograd.Function):
    """``y = x W^T + b`` whose parameters live in a ``FlatLayer`` (see module docstring)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, _anchor: torch.Tensor, layer: FlatLayer,
                step: int) -> torch.Tensor:
        full = layer.acquire(step, "forward")          # 1. all-gather (stage 3)
        w, b = layer.weights(full)
        xc = x.to(layer.dtype)
        with layer.comm.tracer.span(Op.FORWARD, step=step, name=f"F{layer.index}"):
            y = F.linear(xc, w, b)                     # 2. compute
        layer.release(full)                            # 3. free (stage 3)
        ctx.layer, ctx.step, ctx.in_dtype = layer, step, x.dtype
        ctx.save_for_backward(xc)
        return y

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple[Any, ...]:
        (x,) = ctx.saved_tensors
        layer: FlatLayer = ctx.layer
        full = layer.acquire(ctx.step, "backward")     # 1. all-gather again (stage 3)
        w, _ = layer.weights(full)
        gy = gy.to(layer.dtype)
        with layer.comm.tracer.span(Op.BACKWARD, step=ctx.step, name=f"B{layer.index}"):
            gx = gy @ w                                # 2. input and weight gradients
            gw, gb = gy.t() @ x, gy.sum(0)
        layer.release(full)                            # 3. free (stage 3)
        layer.reduce_grads(gw, gb, ctx.step)           # 4. all-reduce / keep / reduce-scatter
        return gx.to(ctx.in_dtype), None, None, None


class ShardedMLP:
    """The lesson MLP (Linear+ReLU blocks, then a Linear) over ``FlatLayer`` buffers."""

    def __init__(self, reference: torch.nn.Sequential, *, stage: int, dtype: torch.dtype,
                 pad: bool, comm: Comm, checkpointing: bool = False, segment: int = 2):
        self.meter = Meter()
        linears = [m for m in reference if isinstance(m, torch.nn.Linear)]
        self.layers = [FlatLayer(i, m.weight, m.bias, stage=stage, dtype=dtype, pad=pad,
                                 comm=comm, meter=self.meter) for i, m in enumerate(linears)]
        self.checkpointing, self.segment = checkpointing, segment
        self.step = 0

    def _segment(self, first: int, stop: int) -> Callable[..., torch.Tensor]:
        """Hidden blocks ``first..stop-1`` (Linear+ReLU each) as one function."""
        def run(x: torch.Tensor, *anchors: torch.Tensor) -> torch.Tensor:
            for i, anchor in zip(range(first, stop), anchors):
                x = torch.relu(ShardedLinear.apply(x, anchor, self.layers[i], self.step))
            return x
        return run

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        hidden = len(self.layers) - 1
        k = self.segment if self.checkpointing else hidden
        for first in range(0, hidden, max(k, 1)):
            stop = min(first + k, hidden)
            run = self._segment(first, stop)
            anchors = [layer.anchor for layer in self.layers[first:stop]]
            if self.checkpointing:
                # reentrant checkpoint saves only the segment input (visible to our hooks)
                x = checkpoint(run, x, *anchors, use_reentrant=True)
            else:
                x = run(x, *anchors)
        last = self.layers[-1]
        return ShardedLinear.apply(x, last.anchor, last, self.step)

    def kept(self) -> dict[str, list[torch.Tensor]]:
        out: dict[str, list[torch.Tensor]] = {"params": [], "grads": [], "optimizer": []}
        for layer in self.layers:
            for k, v in layer.kept().items():
                out[k] += v
        return out

    def full_state(self) -> dict[str, torch.Tensor]:
        """Every layer's full fp32 weights under ``build_mlp``'s state-dict names.

        Stages 1-3 gather the fp32 masters (a collective: every rank must call this).
        """
        state: dict[str, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            if layer.stage == 0:
                full = layer.master.float()
            else:
                full = torch.empty(layer.padded)
                layer.comm.all_gather(full, layer.master.float().clone(), name="final")
            w, b = layer.weights(full)
            state[f"{2 * i}.weight"], state[f"{2 * i}.bias"] = w.clone(), b.clone()
        return state
