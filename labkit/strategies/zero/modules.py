"""ZeRO for any module: every leaf module's parameters become one flat, sharded unit.

``ShardedModel(module, stage=..., comm=...)`` walks a model (a GPT, a pipeline stage, an
MLP) and turns each *leaf* module that owns parameters into a ``FlatUnit``
(``labkit.strategies.zero.sharding``): its parameters leave the module and live in the
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
per step (``flush``); otherwise each unit reduces as soon as its backward is done.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from labkit.strategies.zero.sharding import (
    FlatLayer,
    FlatUnit,
    Meter,
    ShardedLinear,
    ShardedUnits,
)
from labkit.trace.comm import Comm


class ShardedCall(torch.autograd.Function):
    """A non-Linear module run on a ``FlatUnit``'s parameters (see the module docstring)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, _anchor: torch.Tensor, unit: ModuleUnit,
                step: int) -> torch.Tensor:
        full = unit.acquire(step, "forward")        # 1. all-gather (stage 3)
        with torch.no_grad():
            y = unit.call(unit.views(full), x)       # 2. the module's own forward
        unit.release(full)                          # 3. free (stage 3)
        ctx.unit, ctx.step = unit, step
        ctx.save_for_backward(x)
        return y

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple[Any, ...]:
        (x,) = ctx.saved_tensors
        unit: ModuleUnit = ctx.unit
        full = unit.acquire(ctx.step, "backward")   # 1. all-gather again (stage 3)
        params = [v.detach().requires_grad_() for v in unit.views(full)]
        wants_x = bool(ctx.needs_input_grad[0])
        xin = x.detach().requires_grad_() if wants_x else x
        with torch.enable_grad():                   # 2. recompute forward, then backward
            y = unit.call(params, xin)
            grads = torch.autograd.grad(y, params + ([xin] if wants_x else []), gy,
                                        allow_unused=True)
        unit.release(full)                          # 3. free (stage 3)
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


class ShardedModel(ShardedUnits):
    """``module`` with every parameter-owning leaf turned into a ZeRO unit on ``comm``'s ranks.

    ``step`` tags every span the units record; set it before each step.
    """

    def __init__(self, module: nn.Module, *, stage: int, comm: Comm, pad: bool = True,
                 dtype: torch.dtype = torch.float32, defer: bool = False):
        self.module, self.meter, self.step = module, Meter(), 0
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
            self.units.append(unit)
            self.names.append([f"{path}.{n}" if path else n for n in own])

    def _route(self, mod: nn.Module, unit: FlatUnit, fn: Any) -> None:
        def forward(x: torch.Tensor) -> torch.Tensor:
            return fn.apply(x, unit.anchor, unit, self.step)  # type: ignore[no-any-return]

        object.__setattr__(mod, "forward", forward)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)  # type: ignore[no-any-return]

    def full_state(self) -> dict[str, torch.Tensor]:
        """Every parameter, whole and fp32, under the module's own names (a collective)."""
        state: dict[str, torch.Tensor] = {}
        for unit, names in zip(self.units, self.names):
            for name, v in zip(names, unit.views(unit.gather_full())):
                state[name] = v.clone()
        return state
