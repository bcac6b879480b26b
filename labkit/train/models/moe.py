"""A mixture-of-experts MLP: a router picks ``top_k`` of ``experts`` GELU MLPs per token.

Follows the Switch Transformer (Fedus et al. 2021) for top-1 routing, the capacity factor,
token dropping and the auxiliary load-balancing loss, and GShard (Lepikhin et al. 2020) for
top-2; the split into router, token reordering and grouped experts is torchtitan's
(``torchtitan/models/moe``). ``MoE`` takes the place of the GPT block's ``MLP`` (same input
and output, ``(..., width)``):

1. **route**: ``p = softmax(x W_r)`` (in float32); each token picks its ``top_k`` experts.
   With k = 1 the gate is the chosen probability ``p_i(x)`` itself (Switch: so the router
   learns through it); with k > 1 the k chosen probabilities are renormalised to sum to 1
   (GShard);
2. **capacity**: an expert takes at most ``capacity = ceil(capacity_factor x tokens x k /
   experts)`` assignments (``labkit.theory.experts.capacity``). First choices claim slots
   before second choices, earlier tokens before later ones (GShard's priority); the rest are
   *dropped*: their output from this layer is 0, so the block's residual carries the token on;
3. **experts**: kept assignments, sorted by expert, run through ``self.experts`` as one
   batch of rows with a count per expert. Expert parallelism replaces that one module
   (``labkit.train.parallel.experts``) and nothing else here changes;
4. **combine**: each row's output, times its gate, is added back to its token.

Each forward leaves ``aux_loss`` (Switch eq. 4 without alpha: ``experts x sum_i f_i P_i``,
``f_i`` the share of assignments routed to expert i before dropping, ``P_i`` the mean router
probability; 1 when balanced; add ``alpha x aux_loss`` (Switch: alpha = 0.01) to the loss)
and ``stats`` (tokens per expert, kept per expert, dropped, load imbalance). Nothing here
knows of ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from labkit.theory.experts import expert_capacity, load_imbalance


@dataclass(frozen=True)
class MoEStats:
    """What one forward's routing did (plain numbers: metrics and figures read them)."""

    tokens_per_expert: tuple[int, ...]
    """Assignments routed to each expert, before capacity (k per token)."""
    kept_per_expert: tuple[int, ...]
    """Assignments each expert ran: ``min(routed, capacity)``."""
    capacity: int
    """Assignments one expert may take (``labkit.theory.experts.capacity``)."""
    dropped: int
    """Assignments past capacity (with k = 1: tokens that skipped the layer)."""

    @property
    def load_imbalance(self) -> float:
        """The busiest expert's routed load over the mean (1.0 = balanced)."""
        return load_imbalance(self.tokens_per_expert)


def route(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Router logits ``(tokens, experts)`` -> ``(probs, gates, chosen)``: the softmax in
    float32, the gate of each of the ``top_k`` choices ``(tokens, k)`` (the probability for
    k = 1, renormalised over the k choices for k > 1) and the chosen experts ``(tokens, k)``."""
    probs = F.softmax(logits.float(), dim=-1)
    top, chosen = probs.topk(top_k, dim=-1)
    gates = top if top_k == 1 else top / top.sum(dim=-1, keepdim=True)
    return probs, gates, chosen


def keep_mask(chosen: torch.Tensor, experts: int, cap: int) -> torch.Tensor:
    """Which assignments ``chosen (tokens, k)`` fit under capacity ``cap``: each expert's
    slots are filled choice by choice (all first choices, then all second ones), in token
    order within a choice."""
    by_choice = chosen.t().reshape(-1)  # choice-major: (k * tokens,)
    slot = F.one_hot(by_choice, experts).cumsum(dim=0).gather(1, by_choice[:, None])[:, 0] - 1
    return (slot < cap).reshape(chosen.shape[1], chosen.shape[0]).t()


def switch_aux_loss(probs: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """``experts x sum_i f_i P_i`` (Switch eq. 4): ``f_i`` the share of the ``chosen``
    assignments that went to expert i (not differentiable), ``P_i`` the mean of ``probs``
    (which carries the gradient)."""
    experts = probs.shape[-1]
    f = torch.bincount(chosen.reshape(-1), minlength=experts).to(probs.dtype) / chosen.numel()
    return experts * (f * probs.mean(dim=0)).sum()


class GroupedExperts(nn.Module):
    """``experts`` GELU MLPs as stacked weights (expert on dim 0; sharding slices it).

    ``forward(rows, counts)``: ``rows`` sorted by expert, ``counts[i]`` of them for expert i;
    returns each row's MLP output in the same order.
    """

    def __init__(self, width: int, inner: int, experts: int, proj_std: float = 0.02):
        super().__init__()
        self.fc_weight = nn.Parameter(torch.randn(experts, inner, width) * 0.02)
        self.fc_bias = nn.Parameter(torch.zeros(experts, inner))
        self.proj_weight = nn.Parameter(torch.randn(experts, width, inner) * proj_std)
        self.proj_bias = nn.Parameter(torch.zeros(experts, width))

    @property
    def experts(self) -> int:
        return int(self.fc_weight.shape[0])

    def forward(self, rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
        if len(counts) != self.experts:
            raise ValueError(f"{len(counts)} counts for {self.experts} experts")
        outs = []
        for i, x in enumerate(rows.split(counts)):
            h = F.gelu(F.linear(x, self.fc_weight[i], self.fc_bias[i]))
            outs.append(F.linear(h, self.proj_weight[i], self.proj_bias[i]))
        return torch.cat(outs) if outs else rows


class MoE(nn.Module):
    """Router, capacity and ``experts`` GELU MLPs in place of one MLP (see the module)."""

    def __init__(self, width: int, inner: int, experts: int, *, top_k: int = 1,
                 capacity_factor: float = 1.25, name: str = "", proj_std: float = 0.02):
        super().__init__()
        expert_capacity(1, experts, capacity_factor, top_k)  # validates the three numbers
        self.name, self.top_k, self.capacity_factor = name, top_k, capacity_factor
        self.num_experts = experts
        self.router = nn.Linear(width, experts, bias=False)
        nn.init.normal_(self.router.weight, 0.0, 0.02)
        self.experts: nn.Module = GroupedExperts(width, inner, experts, proj_std)
        self.aux_loss: torch.Tensor = torch.zeros(())
        self.stats: MoEStats | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, width = x.shape, x.shape[-1]
        tokens = x.reshape(-1, width)
        n, k, e = tokens.shape[0], self.top_k, self.num_experts
        # 1. route
        probs, gates, chosen = route(self.router(tokens), k)
        self.aux_loss = switch_aux_loss(probs, chosen)
        # 2. capacity: drop what does not fit
        cap = expert_capacity(n, e, self.capacity_factor, k)
        kept = keep_mask(chosen, e, cap)
        # 3. kept assignments sorted by expert (stable: token order within an expert)
        flat_expert = chosen.reshape(-1)
        live = kept.reshape(-1).nonzero()[:, 0]
        order = live[torch.argsort(flat_expert[live], stable=True)]
        counts = torch.bincount(flat_expert[order], minlength=e).tolist()
        token = order // k
        rows = self.experts(tokens[token], counts)
        # 4. combine: gate-weighted rows back onto their tokens; dropped ones stay 0
        weighted = rows * gates.reshape(-1)[order, None].to(rows.dtype)
        out = torch.zeros_like(tokens).index_add(0, token, weighted)
        routed = torch.bincount(flat_expert, minlength=e).tolist()
        self.stats = MoEStats(tuple(routed), tuple(counts), cap, int(n * k - len(order)))
        return out.reshape(shape)


def moe_blocks(model: nn.Module, experts: int, *, top_k: int = 1,
               capacity_factor: float = 1.25) -> nn.Module:
    """Every GPT block's ``MLP`` replaced by an ``MoE`` of the same width and inner size (in
    place; seed the RNG first for the same experts on every rank). Returns ``model``."""
    from labkit.train.models.gpt import Block

    for block in model.modules():
        if isinstance(block, Block) and block.mlp is not None:
            mlp = block.mlp
            block.mlp = MoE(mlp.fc.in_features, mlp.fc.out_features, experts,  # type: ignore
                            top_k=top_k, capacity_factor=capacity_factor, name=mlp.name)
    return model


def aux_loss_of(model: nn.Module) -> torch.Tensor:
    """The sum of every MoE layer's auxiliary loss from the last forward (0 without MoE)."""
    losses = [m.aux_loss for m in model.modules() if isinstance(m, MoE)]
    return torch.stack(losses).sum() if losses else torch.zeros(())
