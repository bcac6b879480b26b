"""labkit.theory.experts: Switch's capacity (Fedus et al. 2021, eq. 3), dropped tokens, load
imbalance, the all-to-all bytes of expert parallelism from a routing, and MoE parameters."""

from __future__ import annotations

import pytest

from labkit.base.errors import ConfigError
from labkit.theory import (
    active_params_per_token,
    combine_bytes,
    counts_bytes,
    dispatch_bytes,
    dropped_tokens,
    expert_capacity,
    kept_per_expert,
    load_imbalance,
    mlp_params,
    moe_params,
    tokens_between_ranks,
)
from labkit.theory.experts import owner_of, switch_aux_loss


@pytest.mark.parametrize(("tokens", "experts", "cf", "k", "want"), [
    (64, 8, 1.0, 1, 8), (64, 8, 1.25, 1, 10), (64, 8, 1.1, 1, 9), (64, 8, 1.0, 2, 16),
    (10, 4, 1.0, 1, 3), (0, 4, 1.0, 1, 0), (8, 4, 0.25, 1, 1)])
def test_capacity_is_ceil_of_factor_tokens_k_over_experts(tokens: int, experts: int, cf: float,
                                                          k: int, want: int) -> None:
    assert expert_capacity(tokens, experts, cf, k) == want


def test_capacity_refuses_what_cannot_route() -> None:
    with pytest.raises(ConfigError, match=r"top_k \(3\) must be <= experts \(2\)"):
        expert_capacity(8, 2, 1.0, 3)
    with pytest.raises(ConfigError, match="capacity_factor"):
        expert_capacity(8, 2, -1.0)
    with pytest.raises(ConfigError, match=r"experts \(0\)"):
        expert_capacity(8, 0, 1.0)


def test_dropped_and_kept_follow_the_count_vector() -> None:
    counts = [12, 4, 8, 8]
    assert kept_per_expert(counts, 8) == [8, 4, 8, 8]
    assert dropped_tokens(counts, 8) == 4
    assert dropped_tokens(counts, 12) == 0
    assert sum(kept_per_expert(counts, 5)) + dropped_tokens(counts, 5) == sum(counts)


def test_load_imbalance_is_max_over_mean() -> None:
    assert load_imbalance([8, 8, 8, 8]) == 1.0
    assert load_imbalance([12, 4, 8, 8]) == 1.5
    assert load_imbalance([32, 0, 0, 0]) == 4.0
    assert load_imbalance([0, 0]) == 0.0


def test_switch_aux_loss_bounds() -> None:
    assert switch_aux_loss([0.25] * 4, [0.25] * 4) == pytest.approx(1.0)
    assert switch_aux_loss([1, 0, 0, 0], [1, 0, 0, 0]) == 4.0
    with pytest.raises(ConfigError):
        switch_aux_loss([0.5, 0.5], [1.0])


def test_all_to_all_bytes_from_a_routing() -> None:
    """2 ranks, 4 experts (rank 0: experts 0-1, rank 1: 2-3), hidden 16, float32.
    Rank 0 keeps (3, 1, 2, 2): 4 rows stay, 4 go to rank 1 -> 4 x 16 x 4 = 256 B on the wire,
    8 x 64 = 512 B of payload. Rank 1 keeps (0, 5, 1, 1): 5 rows to rank 0 -> 320 B."""
    send = tokens_between_ranks([[3, 1, 2, 2], [0, 5, 1, 1]], 2)
    assert send == [[4, 4], [5, 2]]
    assert dispatch_bytes(send, 16) == [256, 320]
    assert dispatch_bytes(send, 16, include_self=True) == [512, 448]
    # combine: rank 0 returns the 5 rows it got from rank 1, rank 1 the 4 from rank 0
    assert combine_bytes(send, 16) == [320, 256]
    assert combine_bytes(send, 16, include_self=True) == [576, 384]
    assert dispatch_bytes(send, 16, 2) == [128, 160]  # bf16 halves it
    assert counts_bytes(4) == 32


def test_owner_is_a_contiguous_block() -> None:
    assert [owner_of(i, 8, 4) for i in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    with pytest.raises(ConfigError, match=r"experts \(6\) must be a multiple of ep \(4\)"):
        owner_of(0, 6, 4)


def test_params_total_grow_with_experts_active_with_k() -> None:
    """Switch-Base-like in miniature: width 16, inner 64, 8 experts."""
    dense = mlp_params(16, 64)
    assert dense == 2 * 16 * 64 + 64 + 16 == 2128
    assert moe_params(16, 64, 8) == 8 * dense + 16 * 8
    assert active_params_per_token(16, 64, 8, 1) == dense + 128
    assert active_params_per_token(16, 64, 8, 2) == 2 * dense + 128
