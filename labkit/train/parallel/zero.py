"""ZeRO as a transform: every leaf module's parameters become one flat, sharded unit.

Rajbhandari et al. 2020: stage 1 shards the optimizer state over the data-parallel ranks,
stage 2 also the gradients, stage 3 also the parameters. ``ShardedModel(module, stage=...,
comm=...)`` walks any model the registry builds (an MLP, a GPT, a pipeline stage of
either) and turns each *leaf* module that owns parameters into a ``FlatUnit``
(``labkit.train.parallel.zero_units``): its parameters leave the module and live in the
unit's flat buffer, whole (stages 0-2) or as this rank's shard (stage 3), and the module's
``forward`` is routed through an autograd function that does what ZeRO does around it.

* ``nn.Linear`` goes through ``ShardedLinear`` (gradients written out: one matmul each);
* any other module (LayerNorm, Embedding, a bias) through ``ShardedCall``: forward runs the
  module's own code on the unit's parameters without recording a graph; backward gathers
  them again (stage 3) and *recomputes* that forward with autograd to get the gradients, as
  activation checkpointing does. That is what lets stage 3 really free a module's
  parameters between its forward and its backward, for any module; those modules are cheap
  (elementwise or lookups), so the recomputation costs little.

With ``defer=True`` (pipelines) gradients are summed over the microbatches and reduced once
per step (``flush``); otherwise each unit reduces as soon as its backward is done. With
``checkpoint_segment`` (and the model's ``Layout``) the blocks run in checkpointed segments
of that many blocks: only each segment's input is saved, and its forward runs again in
backward (``torch.utils.checkpoint``, reentrant, so the saved tensors stay visible to the
byte accounting).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from labkit.trace.comm import Comm
from labkit.train.models.layout import Layout
from labkit.train.parallel.zero_units import (
    FlatLayer,
    FlatUnit,
    Meter,
    ShardedLinear,
    ShardedUnits,
)


class ShardedCall(torch.autograd.Function):
    """A non-Linear module run on a ``FlatUnit``'s parameters (see the module docstring)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, _anchor: torch.Tensor, unit: ModuleUnit,
                step: int) -> torch.Tensor:
        with unit.gathered(step, "forward") as full, torch.no_grad():
            y = unit.call(unit.views(full), x)       # the module's own forward
        ctx.unit, ctx.step = unit, step
        ctx.save_for_backward(x)
        return y

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple[Any, ...]:
        (x,) = ctx.saved_tensors
        unit: ModuleUnit = ctx.unit
        wants_x = bool(ctx.needs_input_grad[0])
        xin = x.detach().requires_grad_() if wants_x else x
        with unit.gathered(ctx.step, "backward") as full, torch.enable_grad():
            params = [v.detach().requires_grad_() for v in unit.views(full)]
            y = unit.call(params, xin)              # recompute forward, then backward
            grads = torch.autograd.grad(y, params + ([xin] if wants_x else []), gy,
                                        allow_unused=True)
        unit.reduce_grads(list(grads[:len(params)]), ctx.step)  # 4. reduce
        return (grads[-1] if wants_x else None), None, None, None


class ModuleUnit(FlatUnit):
    """A ``FlatUnit`` holding one module's own parameters; ``call`` runs that module."""

    def __init__(self, index: int, module: nn.Module, names: list[str], **kw: Any):
        super().__init__(index, [getattr(module, n) for n in names], **kw)
        self.module, self.names = module, names
        self.forward = type(module).forward

    def call(self, params: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        for name, p in zip(self.names, params):  # plain attributes for this one call
            object.__setattr__(self.module, name, p)
        try:
            return self.forward(self.module, x)  # type: ignore[no-any-return]
        finally:
            for name in self.names:
                object.__delattr__(self.module, name)


def _run_blocks(blocks: list[nn.Module]) -> Any:
    def run(x: torch.Tensor, *_anchors: torch.Tensor) -> torch.Tensor:
        for block in blocks:
            x = block(x)
        return x
    return run


class ShardedModel(ShardedUnits):
    """``module`` with every parameter-owning leaf turned into a ZeRO unit on ``comm``'s ranks.

    ``step`` tags every span the units record; set it before each step.
    """

    def __init__(self, module: nn.Module, *, stage: int, comm: Comm, pad: bool = True,
                 dtype: torch.dtype = torch.float32, defer: bool = False,
                 layout: Layout | None = None, checkpoint_segment: int = 0):
        self.module, self.meter, self.step = module, Meter(), 0
        self.layout, self.segment = layout, checkpoint_segment
        if checkpoint_segment and layout is None:
            raise ValueError("checkpointed segments need the model's Layout (its blocks)")
        self.unit_of: dict[int, FlatUnit] = {}  # id(module) -> its unit
        self.units: list[FlatUnit] = []
        self.names: list[list[str]] = []  # full parameter names of each unit
        for path, mod in list(module.named_modules()):
            own = [n for n, _ in mod.named_parameters(recurse=False)]
            if not own:
                continue
            if any(True for _ in mod.children()):
                raise ValueError(f"module {path!r} has parameters of its own and children; "
                                 f"ZeRO units must be leaf modules")
            kw = {"stage": stage, "dtype": dtype, "pad": pad, "comm": comm,
                  "meter": self.meter, "defer": defer}
            index = len(self.units)
            if isinstance(mod, nn.Linear):
                unit: FlatUnit = FlatLayer(index, mod.weight, mod.bias, **kw)
                self._route(mod, unit, ShardedLinear)
            else:
                unit = ModuleUnit(index, mod, own, **kw)
                self._route(mod, unit, ShardedCall)
            for n in own:
                del mod._parameters[n]
            self.unit_of[id(mod)] = unit
            self.units.append(unit)
            self.names.append([f"{path}.{n}" if path else n for n in own])

    def _route(self, mod: nn.Module, unit: FlatUnit, fn: Any) -> None:
        def forward(x: torch.Tensor) -> torch.Tensor:
            return fn.apply(x, unit.anchor, unit, self.step)  # type: ignore[no-any-return]

        object.__setattr__(mod, "forward", forward)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.segment or self.layout is None:
            return self.module(x)  # type: ignore[no-any-return]
        from torch.utils.checkpoint import checkpoint

        lay, k = self.layout, self.segment
        if lay.prologue is not None:
            x = lay.prologue(x)
        for first in range(0, len(lay.blocks), k):
            blocks = lay.blocks[first:first + k]
            # the segment's units' anchors are its inputs too: autograd then runs its
            # backward (recompute + reduce) even where x itself needs no gradient
            anchors = [self.unit_of[id(m)].anchor for b in blocks for m in b.modules()
                       if id(m) in self.unit_of]
            x = checkpoint(_run_blocks(blocks), x, *anchors, use_reentrant=True)
        return lay.epilogue(x) if lay.epilogue is not None else x

    def full_state(self) -> dict[str, torch.Tensor]:
        """Every parameter, whole and fp32, under the module's own names (a collective)."""
        state: dict[str, torch.Tensor] = {}
        for unit, names in zip(self.units, self.names):
            for name, v in zip(names, unit.views(unit.gather_full())):
                state[name] = v.clone()
        return state
