"""ZeRO for the parameters a leaf module does not own alone: tied, frozen, or held beside
child modules (issue 25: ZeRO "on any module tree").

``ShardedModel`` turns each leaf module that owns its parameters into one unit whose forward
it reroutes (``labkit.train.parallel.zero``). Three kinds of parameter do not fit that:

* a *tied* weight, one ``Parameter`` registered in two modules (a language model's input
  embedding and output layer, Press & Wolf 2017): giving each module its own copy unties
  it, and the two copies drift apart from the first step;
* a *frozen* parameter (``requires_grad=False``): it must never move and never get
  optimizer state, however its module is sharded;
* a parameter held by a module that also has children (a learned scale on a block, a
  model's own positional table): its module's forward also runs the children, so the
  module cannot be rerouted as one unit.

Each such parameter becomes its own unit, one per *unique* tensor, and lives in the
modules that hold it as a plain attribute for the length of the model's forward (a forward
pre-hook on the model gathers it, a forward hook removes it), the way FSDP2 exposes a
sharded parameter as the output of an all-gather (Zhao et al. 2023, "PyTorch FSDP"):

1. ``GatheredParams`` all-gathers the unit (stage 3) or hands out its buffer (stages 0-2)
   as the output of an autograd function, so every use in the forward -- both ends of a
   tied weight -- feeds one gradient, which autograd sums;
2. its backward receives that sum and reduces it like any unit's gradient (all-reduce,
   keep, reduce-scatter: ``FlatUnit.reduce_grads``);
3. a frozen unit is gathered without autograd: no gradient, no reduction, no update.

The cost of the simplicity: under stage 3 such a parameter stays gathered while autograd
holds it (from its forward to its backward) rather than being gathered again, and the
transient ``Meter`` counts it only during the forward. Registry models (MLP, GPT) have none.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from labkit.train.parallel.zero_units import FlatUnit


class GatheredParams(torch.autograd.Function):
    """1. the unit's full flat parameters as an autograd output; 2. backward reduces."""

    @staticmethod
    def forward(ctx: Any, _anchor: torch.Tensor, unit: FlatUnit, step: int) -> torch.Tensor:
        full = unit.acquire(step, "forward")
        ctx.unit, ctx.step = unit, step
        # stages 0-2: an alias of the unit's buffer, so autograd never marks the buffer
        return full.detach() if full is unit.full else full

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        unit: FlatUnit = ctx.unit
        unit.reduce_grads(list(unit.views(grad)), ctx.step)  # 2. the summed gradient of every use
        return None, None, None


class LooseParams:
    """The units of tied, frozen and non-leaf parameters, and where each one is held."""

    def __init__(self) -> None:
        self.units: list[FlatUnit] = []
        self.holders: list[list[tuple[nn.Module, str]]] = []
        """Per unit: every (module, attribute) that holds its tensor."""
        self.live: list[torch.Tensor] = []

    def add(self, unit: FlatUnit, holders: list[tuple[nn.Module, str]]) -> None:
        self.units.append(unit)
        self.holders.append(holders)

    def attach(self, step: int) -> None:
        """Before the model's forward: every loose parameter gathered and set where held."""
        self.detach()
        for unit, holders in zip(self.units, self.holders):
            if unit.trainable and torch.is_grad_enabled():
                unit.pending += 1
                full = GatheredParams.apply(unit.anchor, unit, step)
            else:  # 3. frozen (or no graph): read only
                full = unit.acquire(step, "forward")
            self.live.append(full)
            (view,) = unit.views(full)
            for module, name in holders:
                object.__setattr__(module, name, view)

    def detach(self) -> None:
        """After the forward: the attributes go; autograd keeps what its backward needs."""
        for holders in self.holders:
            for module, name in holders:
                if name in module.__dict__:
                    object.__delattr__(module, name)
        for unit, full in zip(self.units, self.live):
            if unit.full is None:  # stage 3 gathered it for this forward
                unit.release(full)
        self.live = []

    def hook(self, model: nn.Module, sharded: Any) -> None:
        """Attach on every forward of ``model`` (whoever calls it), detach after it."""
        model.register_forward_pre_hook(lambda _m, _args: self.attach(sharded.step))
        model.register_forward_hook(lambda _m, _args, _out: self.detach())
