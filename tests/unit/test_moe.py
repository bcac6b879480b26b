"""The MoE layer against the Switch Transformer's definitions (Fedus et al. 2021) and GShard's
top-2 (Lepikhin et al. 2020): routing, capacity, dropping and the auxiliary loss, on a worked
example whose every number is written out by hand."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from labkit.base.errors import ConfigError
from labkit.theory.experts import dropped_tokens, expert_capacity, switch_aux_loss
from labkit.train.models import build_gpt
from labkit.train.models.moe import MoE, aux_loss_of, keep_mask, moe_blocks, route

# Worked example: 8 tokens, 4 experts, top-1, capacity factor 1.0 -> capacity ceil(8/4) = 2.
# Token t is the one-hot row of expert CHOICE[t] (times 10), and the router is the identity,
# so token t's logits are 10 at CHOICE[t] and 0 elsewhere.
CHOICE = [0, 0, 0, 1, 1, 2, 0, 3]
"""Expert 0 is asked by 4 tokens (0, 1, 2, 6): tokens 2 and 6 come after its 2 slots."""
ROUTED, KEPT, DROPPED_TOKENS = [4, 2, 1, 1], [2, 2, 1, 1], [2, 6]


def _worked_layer() -> tuple[MoE, torch.Tensor]:
    torch.manual_seed(0)
    layer = MoE(4, 8, 4, top_k=1, capacity_factor=1.0)
    with torch.no_grad():
        layer.router.weight.copy_(torch.eye(4))
    x = 10.0 * F.one_hot(torch.tensor(CHOICE), 4).float()
    return layer, x


def _expert(layer: MoE, i: int, x: torch.Tensor) -> torch.Tensor:
    e = layer.experts
    h = F.gelu(x @ e.fc_weight[i].T + e.fc_bias[i])
    return h @ e.proj_weight[i].T + e.proj_bias[i]  # type: ignore[no-any-return]


def test_top1_routes_each_token_to_its_argmax_with_the_probability_as_gate() -> None:
    """Switch: the gate of a top-1 choice is p_i(x) itself, e^10 / (e^10 + 3) here."""
    layer, x = _worked_layer()
    probs, gates, chosen = route(layer.router(x), 1)
    assert chosen[:, 0].tolist() == CHOICE
    p = math.exp(10) / (math.exp(10) + 3)
    assert gates[:, 0].tolist() == pytest.approx([p] * 8, rel=1e-6)
    assert probs.sum(dim=1).tolist() == pytest.approx([1.0] * 8, rel=1e-6)


def test_capacity_drops_the_late_tokens_and_their_output_is_zero() -> None:
    """Capacity ceil(1.0 x 8 x 1 / 4) = 2: expert 0 runs tokens 0 and 1; tokens 2 and 6
    (its 3rd and 4th) get 0 from the layer; every other token gets p x expert(x) exactly."""
    layer, x = _worked_layer()
    out = layer(x)
    stats = layer.stats
    assert stats is not None
    assert stats.capacity == 2 == expert_capacity(8, 4, 1.0)
    assert list(stats.tokens_per_expert) == ROUTED and list(stats.kept_per_expert) == KEPT
    assert stats.dropped == 2 == dropped_tokens(ROUTED, 2)
    assert stats.load_imbalance == pytest.approx(4 / 2)  # max 4 over mean 8/4
    p = math.exp(10) / (math.exp(10) + 3)
    for t, e in enumerate(CHOICE):
        want = torch.zeros(4) if t in DROPPED_TOKENS else p * _expert(layer, e, x[t])
        assert torch.allclose(out[t], want, atol=1e-7), f"token {t} (expert {e})"


def test_aux_loss_is_experts_times_sum_of_f_times_p() -> None:
    """Switch eq. 4: N sum_i f_i P_i with f = (4, 2, 1, 1)/8 routed shares (before dropping)
    and P_i the mean router probability, computed here by hand."""
    layer, x = _worked_layer()
    layer(x)
    big, small = math.exp(10) / (math.exp(10) + 3), 1 / (math.exp(10) + 3)
    f = [c / 8 for c in ROUTED]
    p_mean = [(c * big + (8 - c) * small) / 8 for c in ROUTED]
    want = 4 * sum(fi * pi for fi, pi in zip(f, p_mean))
    assert layer.aux_loss.item() == pytest.approx(want, rel=1e-6)
    assert switch_aux_loss(f, p_mean) == pytest.approx(want)


def test_aux_loss_is_one_when_the_router_is_uniform_and_grows_with_imbalance() -> None:
    """Uniform probabilities give exactly 1 whatever the choices; all tokens on one expert
    with certainty give N (Switch: the loss is minimised under uniform routing)."""
    layer = MoE(4, 8, 4)
    with torch.no_grad():
        layer.router.weight.zero_()
    layer(torch.randn(16, 4))
    assert layer.aux_loss.item() == pytest.approx(1.0, rel=1e-6)
    assert switch_aux_loss([1, 0, 0, 0], [1, 0, 0, 0]) == 4.0
    layer2, x = _worked_layer()
    layer2(x)
    assert layer2.aux_loss.item() > 1.0


def test_top2_gates_are_renormalised_and_first_choices_claim_slots_first() -> None:
    """GShard: the two gates sum to 1; a token's second choice loses its slot to a later
    token's first choice (cap 1: token 0's 2nd choice, expert 1, goes to token 1's 1st)."""
    logits = torch.tensor([[3.0, 1.0, 0.0], [0.0, 3.0, 1.0]])
    probs, gates, chosen = route(logits, 2)
    assert chosen.tolist() == [[0, 1], [1, 2]]
    assert gates.sum(dim=1).tolist() == pytest.approx([1.0, 1.0])
    p = probs[0]
    assert float(gates[0, 0]) == pytest.approx(float(p[0] / (p[0] + p[1])))
    assert keep_mask(chosen, 3, 1).tolist() == [[True, False], [True, True]]


def test_top2_drops_match_the_formula_and_a_token_can_lose_one_choice() -> None:
    """Whatever the priority order, each expert drops max(0, routed - capacity)."""
    torch.manual_seed(3)
    layer = MoE(16, 32, 4, top_k=2, capacity_factor=0.5)
    layer(torch.randn(40, 16))
    s = layer.stats
    assert s is not None and s.capacity == expert_capacity(40, 4, 0.5, 2) == 10
    assert sum(s.tokens_per_expert) == 80
    assert s.dropped == dropped_tokens(s.tokens_per_expert, s.capacity) > 0
    assert list(s.kept_per_expert) == [min(c, 10) for c in s.tokens_per_expert]


def test_gradients_reach_router_and_experts() -> None:
    """The router learns through the gates (top-1 keeps p_i(x), not 1) and the aux loss."""
    torch.manual_seed(1)
    layer = MoE(16, 32, 4, capacity_factor=4.0)
    x = torch.randn(2, 8, 16, requires_grad=True)
    out = layer(x)
    assert out.shape == x.shape
    (out.square().sum() + 0.01 * layer.aux_loss).backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert x.grad is not None


def test_moe_blocks_swap_the_gpt_mlps_and_collect_the_aux_losses() -> None:
    torch.manual_seed(0)
    gpt = moe_blocks(build_gpt(32, 16, 2, 2, 8, seed=0), 4, top_k=2, capacity_factor=2.0)
    layers = [m for m in gpt.modules() if isinstance(m, MoE)]
    assert len(layers) == 2 and layers[0].name == "L0.mlp"
    logits = gpt(torch.randint(0, 32, (2, 8)))
    loss = logits.logsumexp(-1).mean() + 0.01 * aux_loss_of(gpt)
    loss.backward()
    assert aux_loss_of(gpt).item() >= 1.0 - 1e-6  # >= 1, equality only when balanced


def test_bad_numbers_are_refused_with_the_rule() -> None:
    with pytest.raises(ConfigError, match=r"top_k \(5\) must be <= experts \(4\)"):
        MoE(8, 16, 4, top_k=5)
    with pytest.raises(ConfigError, match="capacity_factor"):
        MoE(8, 16, 4, capacity_factor=0.0)
