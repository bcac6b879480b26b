"""Expert parallelism: an MoE layer's experts split over the ranks of an ``ep`` group.

GShard (Lepikhin et al. 2020) and the Switch Transformer (Fedus et al. 2021) place different
experts on different devices; torchtitan's ``ExpertParallel`` does it as a wrapper around the
grouped experts, which is the shape here. Every rank keeps the router and ``experts / ep``
experts (rank r: experts ``r*E/ep ... (r+1)*E/ep - 1``) and routes its own tokens
(``labkit.train.models.moe``: capacity and dropping happen there, on the sending rank). Then:

1. **counts**: an all-to-all of each rank's kept rows per expert (int64), so each owner learns
   how many rows arrive from every rank for each of its experts;
2. **dispatch**: an all-to-all of the rows themselves, ``sum of my kept rows for rank d's
   experts`` to each rank d (uneven splits; a dropped token never travels);
3. **experts**: the received rows, grouped by (source rank, expert), are regrouped by expert
   and run through the local experts;
4. **combine**: the reverse all-to-all brings every row back to the rank it came from, in the
   order it left; the MoE layer weights it by its gate and adds it to its token.

Backward runs through both all-to-alls (``AllToAll``): the gradient of a row goes back the
way the row came, an all-to-all with the split sizes swapped. The experts' gradients land on
their owner from every rank's tokens (no all-reduce needed for them); the router, replicated,
gets its gradient from the rank's own tokens (data parallelism averages it, as for any
replicated weight). Every all-to-all is a span on the ``Comm`` with its bytes; the bytes
follow from the routing (``labkit.theory.experts.dispatch_bytes``).
"""

from __future__ import annotations

from itertools import accumulate
from typing import Any

import torch
from torch import nn

from labkit.base.errors import ConfigError
from labkit.train.models.moe import GroupedExperts, MoE

COUNTS, DISPATCH, COMBINE = "ep.counts", "ep.dispatch", "ep.combine"
"""Span names of the three forward all-to-alls (backward ones end in ``.grad``)."""
AXIS = "ep"


class EPComm:
    """What the all-to-alls need: the expert-parallel ``Comm`` and the current step. Their
    spans name the ``ep`` axis, whichever group carries them (EP lies over the DP ranks)."""

    def __init__(self, comm: Any, step: int = 0):
        self.comm, self.step = comm, step

    def all_to_all(self, x: torch.Tensor, out_splits: list[int], in_splits: list[int],
                   name: str) -> torch.Tensor:
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        self.comm.all_to_all(out, x.contiguous(), output_split_sizes=out_splits,
                             input_split_sizes=in_splits, name=name, step=self.step,
                             axis=AXIS)
        return out


class AllToAll(torch.autograd.Function):
    """Forward: rows ``in_splits[r]`` to rank r, ``out_splits[r]`` from it. Backward: each
    row's gradient back to where the row came from (the same all-to-all, splits swapped)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, ep: EPComm, out_splits: list[int],
                in_splits: list[int], name: str) -> torch.Tensor:
        ctx.ep, ctx.splits, ctx.name = ep, (out_splits, in_splits), name
        return ep.all_to_all(x, out_splits, in_splits, name)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        out_splits, in_splits = ctx.splits
        return ctx.ep.all_to_all(grad, in_splits, out_splits, f"{ctx.name}.grad"), None, None, \
            None, None


def all_to_all(x: torch.Tensor, ep: EPComm, out_splits: list[int], in_splits: list[int],
               name: str) -> torch.Tensor:
    """``AllToAll`` (differentiable, uneven splits along dim 0)."""
    return AllToAll.apply(x, ep, out_splits, in_splits, name)  # type: ignore[no-any-return]


class ExpertParallelExperts(nn.Module):
    """This rank's slice of the experts behind the counts, dispatch and combine all-to-alls:
    called like ``GroupedExperts`` with all experts' rows and counts (see the module)."""

    def __init__(self, local: GroupedExperts, ep: EPComm, experts: int):
        super().__init__()
        self.local, self.ep, self.num_experts = local, ep, experts

    def forward(self, rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
        size, per = self.ep.comm.world_size, self.local.experts
        # 1. counts: recv[s][j] = rows rank s sends for my local expert j
        sent = torch.tensor(counts, dtype=torch.int64, device=rows.device)
        got = torch.empty_like(sent)
        self.ep.comm.all_to_all(got, sent, name=COUNTS, step=self.ep.step, axis=AXIS)
        recv = got.view(size, per).tolist()
        in_splits = [sum(counts[d * per:(d + 1) * per]) for d in range(size)]
        out_splits = [sum(r) for r in recv]
        # 2. dispatch
        arrived = all_to_all(rows, self.ep, out_splits, in_splits, DISPATCH)
        # 3. regroup (source, expert) -> (expert, source), run the local experts, undo
        edge = list(accumulate((n for row in recv for n in row), initial=0))  # block s*per+j
        perm = [i for j in range(per) for s in range(size)
                for i in range(edge[s * per + j], edge[s * per + j + 1])]
        index = torch.tensor(perm, dtype=torch.int64, device=rows.device)
        out = self.local(arrived[index], [sum(recv[s][j] for s in range(size))
                                          for j in range(per)])
        back = torch.empty_like(out).index_copy(0, index, out)
        # 4. combine
        return all_to_all(back, self.ep, in_splits, out_splits, COMBINE)


def shard_experts(experts: GroupedExperts, ep_rank: int, ep_size: int) -> GroupedExperts:
    """``experts`` cut to rank ``ep_rank``'s contiguous block of ``experts / ep_size`` (in
    place: its stacked weights are sliced along the expert dimension). Returns it."""
    n = experts.experts
    if n % ep_size:
        raise ConfigError(f"experts ({n}) must be a multiple of ep ({ep_size}); e.g. experts=8 "
                          "with ep=2 or 4")
    per = n // ep_size
    for name, p in list(experts.named_parameters()):
        setattr(experts, name, nn.Parameter(p.detach()[ep_rank * per:(ep_rank + 1) * per].clone()))
    return experts


def expert_parallel(model: nn.Module, comm: Any, step: int = 0) -> EPComm:
    """Shard every MoE layer of ``model`` over ``comm`` (the ``ep`` group's ``Comm``) in
    place: each keeps this rank's experts behind the all-to-alls. Returns the ``EPComm``
    (set its ``step`` to label the spans)."""
    ep = EPComm(comm, step)
    for mod in list(model.modules()):
        if isinstance(mod, MoE):
            local = mod.experts
            if not isinstance(local, GroupedExperts):
                raise TypeError(f"{mod.name or 'MoE'} is already expert-parallel")
            shard_experts(local, comm.rank, comm.world_size)
            mod.experts = ExpertParallelExperts(local, ep, mod.num_experts)
    return ep


def gather_experts(shards: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Every ep rank's ``GroupedExperts`` tensors (state or gradients, in rank order) -> all
    experts' (concatenated along the expert dimension)."""
    return {name: torch.cat([s[name] for s in shards]) for name in shards[0]}
