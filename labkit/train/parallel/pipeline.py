"""Pipeline parallelism as a transform: a stage is a contiguous run of the model's blocks.

GPipe (Huang et al. 2019) cuts a model *across layers*: stage 0 holds the first blocks
(and the model's prologue, the GPT's embedding), the last stage the last blocks (and the
epilogue: the MLP's classifier, the GPT's final LayerNorm and head); only the activation at
each cut crosses between ranks. ``Stage`` keeps the modules of one such run -- the same
modules as the whole model, not copies -- and knows their names in the whole model, so a
stage's weights are compared and hashed as one process would name them.

Where to cut: equal block counts, or balanced by the cost of each block, measured on one
microbatch (``measure_block_costs``: the prologue's time is added to the first block and
the epilogue's to the last, so a heavy head counts); ``labkit.schedules.partition`` picks
the cuts that minimise the slowest stage.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from labkit.schedules.partition import Bounds, bounds_by_cost, bounds_by_count
from labkit.train.models.layout import Layout


class Stage(nn.Module):
    """Stage ``stage`` of ``num_stages``: blocks ``bounds[stage] .. bounds[stage+1]-1`` of
    ``layout`` (a model of ``full``'s), plus the prologue on the first stage and the
    epilogue on the last."""

    def __init__(self, layout: Layout, full: nn.Module, stage: int, num_stages: int,
                 bounds: Bounds):
        super().__init__()
        self.stage, self.first, self.last = stage, stage == 0, stage == num_stages - 1
        self.lo, self.hi = bounds[stage], bounds[stage + 1]
        # registration order = parameter order: prologue, blocks, epilogue (as one process)
        self.prologue = nn.ModuleList(layout.prologue_modules if self.first else [])
        self.blocks = nn.ModuleList(layout.blocks[self.lo:self.hi])
        self.epilogue = nn.ModuleList(layout.epilogue_modules if self.last else [])
        self.layout = layout
        whole = {id(p): n for n, p in full.named_parameters()}
        self.full_names = {n: whole[id(p)] for n, p in self.named_parameters()}
        """This stage's parameter names -> the whole model's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layout.run(x, self.lo, self.hi, first=self.first,  # type: ignore[no-any-return]
                               last=self.last)

    def act_shape(self, rows: int) -> tuple[int, ...]:
        """The activation this stage receives and sends for ``rows`` samples."""
        return self.layout.act_shape(rows)

    def param_names(self) -> list[str]:
        """This stage's parameter names in the whole model (``parameters()`` order)."""
        return [self.full_names[n] for n, _ in self.named_parameters()]

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


def _backward_of(fn: Callable[[Any], torch.Tensor], x: Any) -> Callable[[], None]:
    def run() -> None:
        inp = x.detach().requires_grad_() if x.is_floating_point() else x
        fn(inp).float().sum().backward()
    return run


def measure_block_costs(layout: Layout, x: Any, repeats: int = 5) -> list[float]:
    """Seconds of forward + backward of every block on the microbatch ``x`` (the model's
    input), the prologue's time added to the first block and the epilogue's to the last.

    The blocks are timed in rounds, every block once a round (``labkit.lessons.measure``'s
    protocol): a busy moment on a shared machine then slows every block of that round alike
    instead of one block's repeats, and each block keeps its fastest round (after a warm-up
    round). Timing one block ``repeats`` times and then the next let a burst of load land on
    the head alone, and the cut moved."""
    modules = [*layout.prologue_modules, *layout.blocks, *layout.epilogue_modules]
    with torch.no_grad():
        act = layout.prologue(x) if layout.prologue is not None else x
    runs = []
    for block in layout.blocks:
        runs.append(_backward_of(block, act))
        with torch.no_grad():
            act = block(act)
    extra: dict[int, Callable[[], None]] = {}
    if layout.prologue is not None:
        extra[0] = _backward_of(layout.prologue, x)
    if layout.epilogue is not None:
        extra[len(runs) - 1] = _backward_of(layout.epilogue, act)
    items = runs + list(extra.values())
    best = [math.inf] * len(items)
    for round_ in range(repeats + 1):
        for k, run in enumerate(items):
            t0 = time.perf_counter()
            run()
            if round_:  # the first round is the warm-up
                best[k] = min(best[k], time.perf_counter() - t0)
    costs = best[:len(runs)]
    for index, seconds in zip(extra, best[len(runs):]):
        costs[index] += seconds
    for mod in modules:
        mod.zero_grad(set_to_none=True)
    return costs


def choose_bounds(comm: Any, layout: Layout, num_stages: int, balance: str,
                  sample: Callable[[], Any]) -> Bounds:
    """Where this run cuts: equal block counts, or (``balance="cost"``) the cuts that
    balance the block costs that rank 0 of ``comm`` measures on ``sample()`` (one
    microbatch of input) and broadcasts, so every rank cuts at the same blocks."""
    blocks = len(layout.blocks)
    if balance != "cost" or num_stages == 1:
        return bounds_by_count(blocks, num_stages)
    costs = torch.zeros(blocks, dtype=torch.float64)
    if comm.rank == 0:
        costs = torch.tensor(measure_block_costs(layout, sample()), dtype=torch.float64)
    comm.broadcast(costs, 0)
    return bounds_by_cost(costs.tolist(), num_stages)


def gather_stages(state: dict[str, Any], comm: Any) -> dict[str, Any]:
    """Every pipeline stage's part of the model, put together on the first stage's rank
    (``comm``: the pipeline axis; a collective). The first stage returns the whole
    model's state, the others their own part."""
    if comm.world_size == 1:
        return state
    parts = comm.gather_object({k: v.detach().cpu() for k, v in state.items()}, 0,
                               name="final")
    if parts is None:
        return state
    return {k: v for part in parts for k, v in part.items()}
