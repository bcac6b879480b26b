"""The model a pipeline splits: a stack of layers, cut into contiguous stages.

What this teaches: pipeline parallelism cuts the model *across layers* (GPipe, Huang et al.
2019): stage 0 holds the first layers, the last stage the last ones, and only the activations
at the cut cross between ranks. Layer ``i`` here runs ``layer_costs[i]`` Linear(width, width)
+ ReLU pairs, so a lesson can make some layers cost more than others and watch the stage
holding them cap the whole pipeline. The input projection rides with the first stage and the
classifier head with the last (both are small next to the width x width layers).

Every rank builds the SAME full model from the seed and keeps only its stages' layers, so the
pipeline and the single-process reference start from identical weights.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from labkit.config.run import ModelConfig
from labkit.strategies.pipeline.partition import Bounds, bounds_by_cost, bounds_by_count


class Layer(nn.Sequential):
    """One pipeline layer: ``cost`` Linear(width, width) + ReLU pairs."""

    def __init__(self, width: int, cost: int):
        mods: list[nn.Module] = []
        for _ in range(cost):
            mods += [nn.Linear(width, width), nn.ReLU()]
        super().__init__(*mods)


class FullModel(nn.Module):
    """input projection -> layers[0..depth-1] -> head; what one device would train."""

    def __init__(self, model: ModelConfig, layer_costs: Sequence[int]):
        super().__init__()
        self.inp = nn.Sequential(nn.Linear(model.in_dim, model.width), nn.ReLU())
        self.layers = nn.ModuleList(Layer(model.width, c) for c in layer_costs)
        self.head = nn.Linear(model.width, model.out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)  # type: ignore[no-any-return]


def costs_or_default(layer_costs: Sequence[int], depth: int) -> list[int]:
    return list(layer_costs) if layer_costs else [1] * depth


def build_full(model: ModelConfig, layer_costs: Sequence[int], seed: int) -> FullModel:
    """The whole model, identical on every rank for the same seed."""
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    net = FullModel(model, costs_or_default(layer_costs, model.depth))
    torch.random.set_rng_state(state)
    return net


class StageModule(nn.Module):
    """Model stage ``stage`` of ``num_stages``: its slice of layers (plus inp / head)."""

    def __init__(self, full: FullModel, stage: int, num_stages: int, bounds: Bounds):
        super().__init__()
        self.stage, self.first, self.last = stage, stage == 0, stage == num_stages - 1
        self.lo, self.hi = bounds[stage], bounds[stage + 1]
        self.width = full.head.in_features
        self.inp = full.inp if self.first else None
        self.layers = nn.ModuleList(full.layers[self.lo:self.hi])
        self.head = full.head if self.last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inp is not None:
            x = self.inp(x)
        for layer in self.layers:
            x = layer(x)
        if self.head is not None:
            x = self.head(x)
        return x

    def act_shape(self, rows: int) -> tuple[int, ...]:
        """The shape of the activation this stage receives / sends for ``rows`` samples."""
        return (rows, self.width)

    @contextlib.contextmanager
    def recording_linears(self, on: bool = True) -> Iterator[list[tuple[nn.Linear, Any, Any]]]:
        """While active, every Linear's (module, input, output) in call order (for the zero-
        bubble W pass, which turns output gradients into weight gradients by hand)."""
        seen: list[tuple[nn.Linear, Any, Any]] = []
        if not on:
            yield seen
            return
        hooks = [lin.register_forward_hook(lambda mod, inp, out: seen.append((mod, inp[0], out)))
                 for lin in self.modules() if isinstance(lin, nn.Linear)]
        try:
            yield seen
        finally:
            for h in hooks:
                h.remove()

    def param_names(self) -> list[str]:
        """Names of this stage's parameters in the FullModel's state dict (same order)."""
        names = [f"inp.{n}" for n, _ in self.inp.named_parameters()] if self.inp else []
        for i, layer in enumerate(self.layers):
            names += [f"layers.{self.lo + i}.{n}" for n, _ in layer.named_parameters()]
        if self.head is not None:
            names += [f"head.{n}" for n, _ in self.head.named_parameters()]
        return names


def split_stages(full: FullModel, num_stages: int, bounds: Bounds) -> list[StageModule]:
    return [StageModule(full, s, num_stages, bounds) for s in range(num_stages)]


def measure_layer_costs(full: FullModel, rows: int, repeats: int = 3) -> list[float]:
    """Seconds for forward + backward of each layer on a ``rows`` x width input (median)."""
    width = full.head.in_features
    out: list[float] = []
    for layer in full.layers:
        times = []
        for _ in range(repeats + 1):  # the first run warms up the allocator
            x = torch.randn(rows, width, requires_grad=True)
            t0 = time.perf_counter()
            layer(x).sum().backward()
            times.append(time.perf_counter() - t0)
        layer.zero_grad(set_to_none=True)
        out.append(sorted(times[1:])[len(times[1:]) // 2])
    return out


def stage_bounds(balance: str, depth: int, num_stages: int,
                 measured: Sequence[float] | None = None) -> Bounds:
    """Stage boundaries: equal layer counts, or balanced by measured per-layer cost."""
    if balance == "cost" and measured is not None:
        return bounds_by_cost(measured, num_stages)
    return bounds_by_count(depth, num_stages)
