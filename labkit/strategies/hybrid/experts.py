"""The mixture-of-experts side of a hybrid rank: the MoE GPT, its experts over the ``ep`` axis.

``labkit run hybrid --experts E --top-k K --ep P`` swaps every block's MLP for an MoE layer
(``labkit.train.models.moe``: router, capacity, token dropping) and lays the experts over the
data-parallel ranks, as Megatron-LM and torchtitan do: the ``ep`` ranks of a group hold
different experts (``E / P`` each) and the same copy of everything else, and the MoE layers
send their tokens to the experts' owners with all-to-alls
(``labkit.train.parallel.experts``). What that changes for a rank, here:

* the experts stay outside ZeRO's units (they differ across the data ranks): their
  gradients are plain ``.grad``s, summed over the cp group and -- when the experts are not
  split (``ep = 1``) -- over the data ranks, then divided by ``dp x cp`` (each rank's loss is
  the mean over its own tokens; the all-to-all's backward already brought every ep rank's
  share to the expert's owner). Experts split over fewer ranks than dp (1 < ep < dp) would
  need a group of the ranks holding the same experts; refused before any process starts;
* the routing of every MoE forward is recorded (assignments routed, kept, dropped), so the
  ep axis's bytes can be predicted from it (``labkit.theory.experts.expert_parallel_traffic``)
  and the load per expert shown;
* at the end each expert tensor is all-gathered over ep, under the one-process name.

The one process to compare with is the same MoE GPT (``build_moe_gpt``) on the global batch;
it equals the run when no token is dropped (capacity is per rank's tokens, so dropping
differs) and the loss has no auxiliary term (the Switch loss of a rank's tokens is not the
global batch's): ``aux_loss`` is recorded, not added.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from labkit.train.models.moe import GroupedExperts, MoE, MoEStats, moe_blocks
from labkit.train.parallel.experts import EPComm, expert_parallel
from labkit.train.parallel.tensor import gather_slices


def build_moe_gpt(model: nn.Module, options: Any, seed: int) -> nn.Module:
    """``model`` (the registry's GPT) with every MLP an MoE of ``options.experts``, the same on
    every rank for the same seed (the caller's RNG untouched). Returns ``model``."""
    state = torch.random.get_rng_state()
    torch.manual_seed(seed + 104729)  # experts and routers: their own stream after the GPT's
    try:
        return moe_blocks(model, options.experts, top_k=options.top_k,
                          capacity_factor=options.capacity_factor)
    finally:
        torch.random.set_rng_state(state)


class ExpertsOnGrid:
    """A rank's MoE layers: experts sharded over ``ep``, their gradients, their routing."""

    def __init__(self, ctx: Any, model: nn.Module):
        grid = ctx.grid
        self.ctx, self.dp, self.cp = ctx, grid.dp, grid.cp
        self.ep: EPComm | None = expert_parallel(model, ctx.ep_comm) if grid.ep > 1 else None
        self.local = [m for m in model.modules() if isinstance(m, GroupedExperts)]
        self.params = [p for m in self.local for p in m.parameters()]
        self.moes = [m for m in model.modules() if isinstance(m, MoE)]
        self.kept: dict[int, int] = {}
        """Assignments kept per step (every MoE forward of this rank summed)."""
        self.calls: dict[int, int] = {}
        self.routed = [0] * (self.moes[0].num_experts if self.moes else 0)
        """Step 0's assignments routed to each expert (before capacity), all layers."""
        self.dropped = 0
        self.aux_loss: list[float] = []
        self.step = 0
        self._hooks = [m.register_forward_hook(self._seen) for m in self.moes]

    def _seen(self, mod: Any, *_: Any) -> None:
        stats: MoEStats | None = mod.stats
        if stats is None or not torch.is_grad_enabled():
            return
        s = self.step
        self.kept[s] = self.kept.get(s, 0) + sum(stats.kept_per_expert)
        self.calls[s] = self.calls.get(s, 0) + 1
        if s == 0:
            self.routed = [a + b for a, b in zip(self.routed, stats.tokens_per_expert)]
            self.dropped += stats.dropped
            self.aux_loss.append(float(mod.aux_loss.detach()))

    def begin_step(self, step: int) -> None:
        self.step = step
        if self.ep is not None:
            self.ep.step = step

    def sync(self, step: int) -> None:
        """Every expert gradient summed where its copies are (cp; dp when ep = 1), then
        divided by dp x cp: the mean over the global batch, as one process computes it."""
        for i, p in enumerate(self.params):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            for comm in (self.ctx.cp_comm, self.ctx.dp_comm if self.ep is None else None):
                if comm is not None and comm.world_size > 1:
                    comm.all_reduce(p.grad, step=step, name=f"experts{i}")
            p.grad.div_(self.dp * self.cp)

    def full_state(self, names: dict[str, str], stage: nn.Module) -> dict[str, torch.Tensor]:
        """The experts' whole tensors under the one-process names (an all-gather over ep on
        every rank, in the same order)."""
        mine = {id(p) for p in self.params}
        out = {}
        for name, p in stage.named_parameters():
            if id(p) in mine:
                whole = gather_slices(self.ctx.ep_comm, p.detach(), 0) if self.ep is not None \
                    else p.detach().clone()
                out[names[name].replace(".experts.local.", ".experts.")] = whole
        return out

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
