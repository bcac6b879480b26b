"""ZeRO as a transform: every parameter becomes part of one flat, sharded unit.

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

Parameters a leaf module does not own alone -- tied to another module's, frozen, or held
beside child modules -- become one unit per unique tensor instead
(``labkit.train.parallel.zero_params``): tied weights stay tied, frozen ones are never
updated and get no optimizer state, and any module tree can be sharded.

With ``defer=True`` (pipelines) gradients are summed over the microbatches and reduced once
per step (``flush``); otherwise each unit reduces as soon as its backward is done. With
``checkpoint_segment`` (and the model's ``Layout``) the blocks run in checkpointed segments
of that many blocks: only each segment's input is saved, and its forward runs again in
backward (``torch.utils.checkpoint``, reentrant, so the saved tensors stay visible to the
byte accounting).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from labkit.trace.comm import Comm
from labkit.train.models.layout import Layout
from labkit.train.parallel.zero_params import LooseParams
from labkit.train.parallel.zero_units import (
    FlatLayer,
    FlatUnit,
    Meter,
    ShardedLinear,
)


class ShardedUnits:
    """What ZeRO does around the optimizer, for any model made of ``FlatUnit``s."""

    units: list[FlatUnit]
    meter: Meter
    step: int

    @property
    def trained(self) -> list[FlatUnit]:
        """The units the optimizer updates (frozen ones never are)."""
        return [u for u in self.units if u.trainable]

    def flush(self, step: int) -> None:
        """Deferred units (pipelines): one reduction per step of the summed gradients."""
        for unit in self.trained:
            unit.flush(step)

    def grads_to_masters(self, step: int) -> None:
        """Hand each unit's averaged gradient slice to the tensor the optimizer updates
        (stage 1 reduce-scatters the gradients it kept whole here)."""
        for unit in self.trained:
            unit.master.grad = unit.grad_for_optimizer(step)

    def publish(self, step: int) -> None:
        """After the update: drop the gradients; stages 1-2 all-gather the new parameters."""
        for unit in self.trained:
            unit.master.grad = None
        for unit in self.trained:
            unit.publish(step)

    @property
    def masters(self) -> list[torch.Tensor]:
        """The tensors the optimizer updates (this rank's owned slices; no frozen ones)."""
        return [u.master for u in self.trained]

    def kept(self) -> dict[str, list[torch.Tensor]]:
        """Every tensor kept between steps, by model-state term (for the byte accounting)."""
        out: dict[str, list[torch.Tensor]] = {"params": [], "grads": [], "optimizer": []}
        for unit in self.units:
            for k, v in unit.kept().items():
                out[k] += v
        return out


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


def _holders(module: nn.Module) -> tuple[dict[int, list[tuple[str, nn.Module, str]]],
                                          dict[int, list[str]]]:
    """Every place a parameter is held, by the tensor's id: [(module path, module, attribute)]
    (a shared module or a tied weight appears under each of its paths), and the paths under
    which each module appears."""
    places: dict[int, list[tuple[str, nn.Module, str]]] = {}
    paths: dict[int, list[str]] = {}
    for path, mod in module.named_modules(remove_duplicate=False):
        paths.setdefault(id(mod), []).append(path)
        for name, p in mod.named_parameters(recurse=False):
            places.setdefault(id(p), []).append((path, mod, name))
    return places, paths


def _full_name(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


class ShardedModel(ShardedUnits):
    """``module`` with every parameter in a ZeRO unit on ``comm``'s ranks: one unit per leaf
    module that owns its parameters alone, one per tied, frozen or non-leaf parameter.

    ``step`` tags every span the units record; set it before each step (it also forgets
    uses of the previous step whose backward never ran). ``exclude``: modules whose own
    parameters stay plain ``nn.Parameter``s, outside every unit (the caller reduces and
    updates them; expert parallelism's experts, which differ across the data ranks).
    ``device``: where every unit keeps its buffers (the rank's device; default: the default
    device while the model is sharded).
    """

    def __init__(self, module: nn.Module, *, stage: int, comm: Comm, pad: bool = True,
                 dtype: torch.dtype = torch.float32, defer: bool = False,
                 layout: Layout | None = None, checkpoint_segment: int = 0,
                 exclude: Sequence[nn.Module] = (), device: torch.device | str | None = None):
        self.module, self.meter, self._step = module, Meter(), 0
        self.layout, self.segment = layout, checkpoint_segment
        if checkpoint_segment and layout is None:
            raise ValueError("checkpointed segments need the model's Layout (its blocks)")
        self.unit_of: dict[int, FlatUnit] = {}  # id(module) -> its unit
        self.units: list[FlatUnit] = []
        self.names: list[list[str]] = []  # full parameter names of each unit
        self.aliases: dict[str, list[str]] = {}  # a name -> the other names of that tensor
        self.loose = LooseParams()
        places, paths = _holders(module)
        kw = {"stage": stage, "dtype": dtype, "pad": pad, "comm": comm, "meter": self.meter,
              "defer": defer, "device": device}
        done: set[int] = set()
        left_out = {id(m) for m in exclude}  # their parameters stay plain (e.g. sharded experts)
        modules = [(path, mod, list(mod.named_parameters(recurse=False)))
                   for path, mod in module.named_modules()
                   if id(mod) not in left_out]  # before any parameter moves
        for path, mod, params in modules:
            alone = bool(params) and not any(True for _ in mod.children()) and all(
                p.requires_grad and len({id(m) for _, m, _ in places[id(p)]}) == 1
                for _, p in params)
            own = [(n, p) for n, p in params if id(p) not in done]
            if not own:
                continue
            index = len(self.units)
            if alone:  # the fast path: the module's forward runs on its unit
                names = [n for n, _ in own]
                if isinstance(mod, nn.Linear):
                    unit: FlatUnit = FlatLayer(index, mod.weight, mod.bias, **kw)
                    self._route(mod, unit, ShardedLinear)
                else:
                    unit = ModuleUnit(index, mod, names, **kw)
                    self._route(mod, unit, ShardedCall)
                self.unit_of[id(mod)] = unit
                self._add(unit, [_full_name(path, n) for n in names],
                          {_full_name(path, n): [_full_name(q, n) for q in paths[id(mod)]
                                                 if q != path] for n in names})
                for n in names:
                    del mod._parameters[n]
                done |= {id(p) for _, p in own}
                continue
            for name, p in own:  # tied, frozen or beside children: a unit per tensor
                unit = FlatUnit(index, [p], trainable=p.requires_grad, **kw)  # type: ignore[arg-type]
                held = places[id(p)]
                self.loose.add(unit, [(m, n) for _, m, n in held])
                first = _full_name(path, name)
                self._add(unit, [first], {first: [_full_name(hp, hn) for hp, _, hn in held
                                                  if _full_name(hp, hn) != first]})
                for _, m, n in held:
                    m._parameters.pop(n, None)
                done.add(id(p))
                index += 1
        if self.loose.units:
            if checkpoint_segment:
                raise ValueError("checkpointed segments cannot hold tied, frozen or non-leaf "
                                 "parameters (they are attached for the model's forward); "
                                 "use checkpoint_segment=0 for this model")
            self.loose.hook(module, self)

    def _add(self, unit: FlatUnit, names: list[str], aliases: dict[str, list[str]]) -> None:
        """Register a unit under its tensors' first names, with every other name of each
        (a shared module's other paths, a tied weight's other holders)."""
        self.units.append(unit)
        self.names.append(names)
        self.aliases.update({k: v for k, v in aliases.items() if v})

    @property
    def step(self) -> int:
        return self._step

    @step.setter
    def step(self, value: int) -> None:
        if value != self._step:
            for unit in self.units:
                unit.new_step()
        self._step = value

    def _route(self, mod: nn.Module, unit: FlatUnit, fn: Any) -> None:
        def forward(x: torch.Tensor) -> torch.Tensor:
            if torch.is_grad_enabled():
                unit.pending += 1  # a use whose backward will come (a module may be called twice)
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
        """Every parameter, whole and fp32, under the module's own names -- a tied one under
        each of its names, as ``state_dict`` lists it (a collective)."""
        state: dict[str, torch.Tensor] = {}
        for unit, names in zip(self.units, self.names):
            for name, v in zip(names, unit.views(unit.gather_full())):
                state[name] = v.clone()
                for other in self.aliases.get(name, []):
                    state[other] = state[name]
        return state
